"""The standard slip battery over every chapter (issue 25): each typical slip of each
numeric exercise, with its own numbers and with the variants of a few students, is
rejected, and at least MIN_SPECIFIC_SHARE of the messages name the slip. The battery and
the slips are in tests/exercise_harness.py; each chapter's test file runs it on its own
exercises too (with its known pitfalls). The table is printed at the end of the run."""

import json

from exercise_harness import (MIN_SPECIFIC_SHARE, battery_report, full_battery,
                              specific_share)


def test_battery_over_all_chapters(record_property):
    rows, shots = full_battery()
    record_property("slip_battery_report", battery_report())
    total = {}
    for _, counts, _ in rows.values():
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    record_property("slip_battery_total", json.dumps(total))
    accepted = [(s.exercise, s.variant, s.slip.name, s.answer) for s in shots
                if s.outcome == "accepted"]
    assert not accepted, f"slips accepted as right: {accepted}"
    misnamed = [(s.exercise, s.variant, s.slip.name, s.message) for s in shots
                if s.outcome in ("misnamed", "other")]
    assert not misnamed, f"slips named as another slip: {misnamed}"
    assert specific_share(total) >= MIN_SPECIFIC_SHARE, battery_report()


def test_every_collective_exercise_declares_its_ring():
    """An exercise about a collective over n chips declares n (``ring``), so that the
    ring factor's slip gets its hint there and nowhere else. The exercises whose titles
    name a collective but whose answers have no (n - 1)/n to drop are listed, with
    why."""
    from exercise_harness import numeric_ids
    from scalebook.exercises import get_exercise

    from scalebook.exercises.core import _chapters

    no_ring_factor = {
        "1.6": "two chips swap their partial sums: (n - 1)/n = 1/2, the 2x slip",
        "3.13": "latency-bound: the hops dominate, the bandwidth term is small",
        "11.7": "the all-to-all across nodes has two parts, (l - 1)/n of the bytes on "
                "NVLink and (n - l)/n on the card: no one (n - 1)/n to drop",
    }
    words = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "fsdp gather")
    for ch in _chapters():
        for ex_id in numeric_ids(ch):
            ex = get_exercise(ex_id)
            collective = any(w in ex.title.lower() for w in words)
            if collective and ex_id not in no_ring_factor:
                assert ex.ring_sizes(), f"{ex_id} ({ex.title}) declares no ring"
