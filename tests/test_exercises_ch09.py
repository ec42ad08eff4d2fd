"""Chapter 9's exercise checks accept right answers, reject typical wrong ones with their
specific hints, and never raise.

Numeric answers are worked here by hand from the chip and model figures (closed forms, not
the profiling functions the references use). Code answers are written here independently of
scalebook.hlo / scalebook.profiling."""

import math
import re
from collections import defaultdict
from pathlib import Path

import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import P  # noqa: E402

from exercise_harness import slip_battery_tests  # noqa: E402
from scalebook.exercises import evaluate  # noqa: E402
from scalebook.hardware import get_chip  # noqa: E402

v5p, h100 = get_chip("tpu-v5p"), get_chip("gpu-h100")
# LLaMA-3 70B (paper, Table 3; heads from the reference code)
D, F, H, K, h = 8192, 28672, 64, 8, 128

# 9.1: four all-reduces of bf16 [T, d] on a bidirectional ring of 4 (torus axis)
T1 = 16384
AR1 = 4 * (2 * 3 / 4 * 2 * T1 * D) / (2 * v5p.ici_link_bandwidth)


def layer_times(chip, T, S, tp, link_bw):
    """Per-op times of the predicted layer step, by hand (bf16, roofline per op)."""
    C, W = chip.bf16_flops, chip.hbm_bandwidth

    def mm(k, n, mult=1):
        return mult * max(2 * T * k * n / tp / C, 2 * (T * k + k * n / tp + T * n / tp) / W)

    def ew(nbytes, flops, mult=1):
        return mult * max(flops / C, nbytes / W)

    qkv = H * h + 2 * K * h
    fwd_onchip = [ew(2 * 2 * T * D, 4 * T * D), mm(D, qkv),
                  ew(2 * 2 * T * (H + K) * h / tp, 6 * T * (H + K) * h / tp),
                  max(4 * T * S * H * h / tp / C, 2 * T * (2 * H * h + 2 * K * h) / tp / W),
                  mm(H * h, D), ew(2 * 3 * T * D, 5 * T * D), mm(D, 2 * F),
                  ew(2 * 3 * T * F / tp, 5 * T * F / tp), mm(F, D), ew(2 * 3 * T * D, T * D)]
    onchip = 3 * sum(fwd_onchip)          # backward = 2x forward, op by op
    comm = 4 * 2 * (tp - 1) / tp * 2 * T * D / link_bw
    return onchip, comm


on2, comm2 = layer_times(h100, 4096, 4096, 8, h100.ici_links * h100.ici_link_bandwidth)

RIGHT = {
    "9.1": AR1,
    "9.2": comm2 / (on2 + comm2),
    "9.3": "memory",
    "9.4": 32 * 8 * 104 * 128 * 4,
}

WRONG = {
    "9.1": [2 * AR1, AR1 / 2, AR1 / 4, 80 * AR1, AR1 * 4 / 3, AR1 * (7 / 8) / (3 / 4)],
    "9.2": [100 * RIGHT["9.2"], comm2 / on2, 0.5],
    "9.3": ["compute", "communication"],
    "9.4": [32 * 8 * 100 * 64 * 4, 32 * 8 * 100 * 128 * 4, 32 * 8 * 104 * 64 * 4,
            32 * 8 * 104 * 128 * 2],
}

HINTS = {   # a typical mistake and words its hint must contain
    "9.1": [(2 * AR1, "bidirectional"), (AR1 / 2, "four all-reduces"), (AR1 / 4, "one all-reduce"),
            (80 * AR1, "80 layers"), (AR1 * 4 / 3, "2 (n - 1) / n"),
            (AR1 * (7 / 8) / (3 / 4), "4 chips")],
    "9.2": [(100 * RIGHT["9.2"], "percentage"), (comm2 / on2, "whole step")],
    "9.3": [("compute", "about B = 64 FLOPs per byte"), ("communication", "sends nothing")],
    "9.4": [(32 * 8 * 100 * 64 * 4, "without padding"), (32 * 8 * 100 * 128 * 4, "multiple of 8"),
            (32 * 8 * 104 * 64 * 4, "multiple of 128"), (32 * 8 * 104 * 128 * 2, "4 bytes")],
    # (32 * 8 * 104 * 64 * 4 == 32 * 8 * 104 * 128 * 2: one hint names both mistakes)
}

# The standard slip battery on every numeric exercise (tests/exercise_harness.py), with
# the mistakes above as the chapter's known pitfalls.
globals().update(slip_battery_tests(9, {ex: [a for a in v if not isinstance(a, str)]
                                        for ex, v in WRONG.items()}))


@pytest.mark.parametrize("ex", sorted(RIGHT))
def test_right_answers_are_accepted(ex):
    r = evaluate(ex, RIGHT[ex])
    assert r.correct, r


@pytest.mark.parametrize("ex,answer", [(k, a) for k, v in WRONG.items() for a in v])
def test_wrong_answers_are_rejected(ex, answer):
    r = evaluate(ex, answer)
    assert r.status == "wrong", r


@pytest.mark.parametrize("ex,answer,word", [(k, a, w) for k, v in HINTS.items() for a, w in v])
def test_specific_hints(ex, answer, word):
    msg = evaluate(ex, answer).message
    assert word in msg, msg


def test_9_2_one_nvlink_hint():
    on, comm = layer_times(h100, 4096, 4096, 8, h100.ici_link_bandwidth)
    assert "one NVLink link" in evaluate("9.2", comm / (on + comm)).message


@pytest.mark.parametrize("ex,rtol", [("9.1", 0.03), ("9.2", 0.02)])
def test_tolerance_boundary(ex, rtol):
    assert evaluate(ex, RIGHT[ex] * (1 + 0.9 * rtol)).correct
    assert evaluate(ex, RIGHT[ex] * (1 + 1.1 * rtol)).status == "wrong"
    assert evaluate(ex, RIGHT[ex] * (1 - 1.1 * rtol)).status == "wrong"


def test_9_4_is_exact():
    assert evaluate("9.4", RIGHT["9.4"] + 1).status == "wrong"
    assert evaluate("9.4", RIGHT["9.4"] + 0.5).status == "wrong"


@pytest.mark.parametrize("ex", [f"9.{i}" for i in range(1, 9)])
def test_ellipsis_is_not_attempted(ex):
    assert evaluate(ex, ...).status == "not attempted"


@pytest.mark.parametrize("ex", ["9.1", "9.2", "9.4"])
@pytest.mark.parametrize("bad", ["1e-3", None, float("nan"), [1.0]])
def test_malformed_numeric_answers(ex, bad):
    r = evaluate(ex, bad)
    assert r.status == "wrong" and r.message


@pytest.mark.parametrize("bad", [None, 3, "latency"])
def test_malformed_choice(bad):
    r = evaluate("9.3", bad)
    assert r.status == "wrong" and "one of" in r.message
    assert evaluate("9.3", " Memory ").correct


@pytest.mark.parametrize("spelling", ["memory-bound", "Memory bound", "memory_bound"])
def test_9_3_bound_spellings_are_the_choice(spelling):
    """'memory-bound' is what the chapter's tables say: the check reads it as 'memory'
    (a student's report: it was refused as a format error)."""
    assert evaluate("9.3", spelling).correct
    assert "memory-bound is right" not in evaluate("9.3", "compute-bound").message
    assert evaluate("9.3", "compute-bound").status == "wrong"


# ------------------------------------------------------------------------------------------
# 9.5 the slowest op of a trace
# ------------------------------------------------------------------------------------------

def slowest_op(trace_json):
    total = defaultdict(float)
    for e in trace_json["traceEvents"]:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args:
            total[args["hlo_op"]] += e["dur"]
    return max(total, key=total.get)


def longest_event(trace_json):
    evs = [e for e in trace_json["traceEvents"] if "hlo_op" in (e.get("args") or {})]
    return max(evs, key=lambda e: e["dur"])["args"]["hlo_op"]


def most_events(trace_json):
    n = defaultdict(int)
    for e in trace_json["traceEvents"]:
        if "hlo_op" in (e.get("args") or {}):
            n[e["args"]["hlo_op"]] += 1
    return max(n, key=n.get)


def any_event(trace_json):
    total = defaultdict(float)
    for e in trace_json["traceEvents"]:
        if e.get("ph") == "X":
            total[e["name"]] += e["dur"]
    return max(total, key=total.get)


def test_9_5_right_answer():
    r = evaluate("9.5", slowest_op)     # 4 published traces and 3 drawn ones
    assert r.correct and "7 test inputs" in r.message, r


@pytest.mark.parametrize("fn,word", [(longest_event, "single event"),
                                     (most_events, "most events"),
                                     (any_event, "not an HLO op"),
                                     (lambda t: 3, "string")])
def test_9_5_wrong_answers_with_hints(fn, word):
    r = evaluate("9.5", fn)
    assert r.status == "wrong" and word in r.message, r


def one_device(trace_json, device="0"):
    """The slip the issue found accepted: the slowest op of device 0 alone."""
    total = defaultdict(float)
    for e in trace_json["traceEvents"]:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args and str(args.get("device_ordinal")) == device:
            total[args["hlo_op"]] += e["dur"]
    return max(total, key=total.get)


def test_9_5_one_device_is_rejected_with_its_hint():
    """One published trace is not the same on every device, so summing device 0 (or any
    single device) gives another op; the hint says why."""
    for dev in ("0", "1", "2", "3"):
        r = evaluate("9.5", lambda t, dev=dev: one_device(t, dev))
        assert r.status == "wrong" and "one device alone" in r.message, r
    from scalebook.exercises import get_exercise
    uneven = [t for (t,) in get_exercise("9.5").cases[:3] if one_device(t) != slowest_op(t)]
    assert len(uneven) == 1


def test_9_5_drawn_traces_are_valid_and_some_are_uneven():
    """Every drawn trace has one op at least 5% ahead over all devices; about half draw
    each device's durations, so device 0 alone is sometimes a different op."""
    from scalebook.exercises import get_exercise
    drawn = [t for (t,) in get_exercise("9.5").drawn_cases(b"uneven", n=60)]
    differ = 0
    for t in drawn:
        total = defaultdict(float)
        for e in t["traceEvents"]:
            if "hlo_op" in (e.get("args") or {}):
                total[e["args"]["hlo_op"]] += e["dur"]
        first, second = sorted(total.values())[-2:][::-1]
        assert first > 1.05 * second
        differ += one_device(t) != slowest_op(t)
    assert differ >= 3


def test_9_5_malformed():
    assert evaluate("9.5", lambda t: None).status == "not attempted"
    assert "raised KeyError" in evaluate("9.5", lambda t: t["events"]).message
    assert evaluate("9.5", "fusion.1").status == "wrong"


# ------------------------------------------------------------------------------------------
# 9.6 count the fusions
# ------------------------------------------------------------------------------------------

def opcode(line):
    """The opcode of an instruction line: the first word before '(' that follows a space
    after ' = ' (a tuple type has spaces and parentheses of its own; layouts' T(8,128) and
    S(5) follow ':' or ')', not a space)."""
    m = re.search(r"\s([a-z][\w\-]*)\(", " " + line.split(" = ", 1)[1])
    return m.group(1) if m else None


def n_fusions(text):
    """Fusion instructions in ENTRY and in the computations its while loops, conditionals
    and calls run."""
    comps, current, entry = defaultdict(list), None, None
    for line in text.splitlines():
        m = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and "=" not in line.split("(")[0]:
            current = m.group(2)
            entry = current if m.group(1) else entry
            continue
        if current and " = " in line:
            comps[current].append(line)
    todo, seen, count = [entry], {entry}, 0
    while todo:
        comp = todo.pop()
        for line in comps[comp]:
            op = opcode(line)
            count += op == "fusion"
            if op in ("while", "conditional", "call"):
                names = re.findall(r"(?:body|condition|true_computation|false_computation|"
                                   r"to_apply)=%?([\w.\-]+)", line)
                for group in re.findall(r"branch_computations=\{([^}]*)\}", line):
                    names += [g.strip().lstrip("%") for g in group.split(",")]
                for c in names:
                    if c not in seen:
                        seen.add(c)
                        todo.append(c)
    return count


def entry_only(text):
    body = text[text.index("\nENTRY"):]
    return len(re.findall(r"=\s*\S+\s+fusion\(", body))


def test_9_6_right_answer():
    r = evaluate("9.6", n_fusions)      # 8 published programs and 3 drawn ones
    assert r.correct and "11 test inputs" in r.message, r


@pytest.mark.parametrize("fn,word", [(lambda t: t.count(" fusion("), "a fusion calls"),
                                     (lambda t: t.count("fusion"), "instruction names"),
                                     (lambda t: t.count("kind=kLoop"), "kCustom"),
                                     (entry_only, "while body")])
def test_9_6_wrong_answers_with_hints(fn, word):
    r = evaluate("9.6", fn)
    assert r.status == "wrong" and word in r.message, r


def bodies_only(text):
    """The statement once said "the bodies of its loops": fusions of the loop conditions
    left out."""
    conds = set(re.findall(r"condition=%?([\w.\-]+)", text))
    n_cond, current = 0, None
    for line in text.splitlines():
        m = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and "=" not in line.split("(")[0]:
            current = m.group(2)
        elif current in conds and re.search(r"=\s*\S+\s+fusion\(", line):
            n_cond += 1
    return n_fusions(text) - n_cond


def test_9_6_statement_names_conditions_and_a_bodies_only_count_gets_a_hint():
    """A scan's condition holds a fusion here, so counting loop bodies only is wrong: the
    statement must say conditions count, and the check must say so too."""
    r = evaluate("9.6", bodies_only)
    assert r.status == "wrong" and "condition" in r.message, r
    md = (Path(__file__).resolve().parents[1] / "notebooks" / "09_profiling.md").read_text()
    statement = md[md.index("### Exercise 9.6"):md.index("### Exercise 9.7")]
    assert "conditions" in statement


def loops_only(text):
    """The worked solution's first version: follows while loops, not conditionals."""
    comps, current, entry = defaultdict(list), None, None
    for line in text.splitlines():
        m = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and "=" not in line.split("(")[0]:
            current, entry = m.group(2), m.group(2) if m.group(1) else entry
        elif current and " = " in line:
            comps[current].append(line)
    todo, seen, count = [entry], {entry}, 0
    while todo:
        for line in comps[todo.pop()]:
            count += opcode(line) == "fusion"
            if opcode(line) == "while":
                for c in re.findall(r"(?:body|condition)=%?([\w.\-]+)", line):
                    if c not in seen:
                        seen.add(c)
                        todo.append(c)
    return count


def one_word_types(text):
    """Right computations, but the type is taken to be one word: a fusion that returns a
    tuple, '(f32[32]{0}, s32[32]{0}) fusion(...)', is missed."""
    return sum(1 for line in text.splitlines() if re.search(r"=\s*\S+\s+fusion\(", line)) \
        - (text.count(" fusion(") - n_fusions(text))


def test_9_6_conditionals_count_and_a_loops_only_count_gets_a_hint():
    from scalebook import hlo
    from scalebook.exercises import get_exercise
    r = evaluate("9.6", loops_only)
    assert r.status == "wrong" and "branch" in r.message and "cond_layer" in r.message, r
    cases = [t for (t,) in get_exercise("9.6").cases]
    with_conditionals = [t for t in cases if " conditional(" in t]
    assert len(with_conditionals) == 2
    assert all(loops_only(t) < hlo.count_fusions(t) == n_fusions(t) for t in with_conditionals)


def test_9_6_a_tuple_typed_fusion_gets_a_hint():
    r = evaluate("9.6", one_word_types)
    assert r.status == "wrong" and "tuple" in r.message, r


def worked_solution(name):
    """The function ``name`` as the solutions notebook defines it (its code cell run here)."""
    md = (Path(__file__).resolve().parents[1] / "solutions" / "09_profiling.md").read_text()
    start = md.index(f"def {name}(")
    cell = md[md.rindex("```{code-cell}", 0, start):md.index("```", start)]
    namespace = {"defaultdict": defaultdict, "re": re}
    exec(cell.split("\n", 1)[1].split(f"check(")[0], namespace)
    return namespace[name]


def test_9_6_worked_solution_agrees_with_count_fusions_on_drawn_programs():
    """The issue found the worked solution giving 1 where hlo.count_fusions gives 4 (a
    conditional): it must agree on every published program and on drawn ones of every kind
    (loops, conditionals, switches)."""
    from scalebook import hlo
    from scalebook.exercises import get_exercise
    solution = worked_solution("n_fusions")
    ex = get_exercise("9.6")
    drawn = [t for (t,) in ex.drawn_cases(b"conditionals", n=12)]
    kinds = {t.split(",")[0].split("_")[-1] for t in drawn}
    assert {"cond", "switch", "scan", "mlp"} <= kinds, kinds
    for t in [t for (t,) in ex.cases] + drawn:
        assert solution(t) == hlo.count_fusions(t) == n_fusions(t)


def test_9_6_malformed():
    assert evaluate("9.6", lambda t: None).status == "not attempted"
    assert evaluate("9.6", lambda t: True).status == "wrong"
    assert evaluate("9.6", 5).status == "wrong"


# ------------------------------------------------------------------------------------------
# 9.7 remove the all-gather
# ------------------------------------------------------------------------------------------

def mlp_slow(x, w1, w2):
    h = jax.nn.relu(x @ w1)
    h = jax.lax.with_sharding_constraint(h, P())
    return h @ w2


def mlp_replicated_out(x, w1, w2):
    return jax.lax.with_sharding_constraint(jax.nn.relu(x @ w1) @ w2, P())


def test_9_7_right_answer():
    r = evaluate("9.7", lambda x, w1, w2: jnp.maximum(x @ w1, 0) @ w2)
    assert r.correct, r


@pytest.mark.parametrize("fn", [mlp_slow, mlp_replicated_out])
def test_9_7_all_gather_is_rejected_with_hint(fn):
    r = evaluate("9.7", fn)
    assert r.status == "wrong" and "still gathers" in r.message, r


def test_9_7_wrong_numbers_and_malformed():
    assert "wrong numbers" in evaluate("9.7", lambda x, w1, w2: (x @ w1) @ w2).message
    assert evaluate("9.7", lambda x, w1, w2: None).status == "not attempted"
    assert evaluate("9.7", "mlp").status == "wrong"


# ------------------------------------------------------------------------------------------
# 9.8 compile once
# ------------------------------------------------------------------------------------------

def clipped_update(w, g, lr):
    return w - lr * jnp.where(lr > 0.1, jnp.clip(g, -1.0, 1.0), g)


def branchy_update(w, g, lr):          # the statement's code: a Python if on lr
    if lr > 0.1:
        g = jnp.clip(g, -1.0, 1.0)
    return w - lr * g


def test_9_8_right_answer():
    r = evaluate("9.8", lambda: jax.jit(clipped_update))
    assert r.correct, r
    cond = lambda w, g, lr: w - lr * jax.lax.cond(lr > 0.1, lambda g: jnp.clip(g, -1, 1),
                                                  lambda g: g, g)
    assert evaluate("9.8", lambda: jax.jit(cond)).correct


def test_9_8_static_lr_is_rejected_with_hint():
    r = evaluate("9.8", lambda: jax.jit(branchy_update, static_argnums=2))
    assert r.status == "wrong" and "static" in r.message and "jnp.where" in r.message, r


def test_9_8_other_mistakes():
    assert "jitted" in evaluate("9.8", lambda: clipped_update).message
    r = evaluate("9.8", lambda: jax.jit(branchy_update))        # lr traced, Python if
    assert r.status == "wrong" and "Python if" in r.message and "jnp.where" in r.message, r
    # section 9.4's update, without the clipping: wrong above 0.1
    r = evaluate("9.8", lambda: jax.jit(lambda w, g, lr: w - lr * g))
    assert "wrong numbers" in r.message and "clipped" in r.message, r
    r = evaluate("9.8", lambda: jax.jit(lambda w, g, lr: w - lr * jnp.clip(g, -1, 1)))
    assert "wrong numbers" in r.message and "not clipped" in r.message, r
    assert "wrong numbers" in evaluate("9.8", lambda: jax.jit(lambda w, g, lr: w + lr * g)).message
    assert evaluate("9.8", lambda: None).status == "not attempted"
    assert "raised" in evaluate("9.8", lambda: 1 / 0).message
    assert evaluate("9.8", 3).status == "wrong"
    assert evaluate("9.8", lambda: 3).status == "wrong"


# ------------------------------------------------------------------------------------------
# Variants (assignments draw other numbers) and drawn code inputs
# ------------------------------------------------------------------------------------------

def test_9_1_variant():
    params = {"tp": 8, "chip": "tpu-v6e", "n_seq": 1, "seq_len": 4096}
    v6e = get_chip("tpu-v6e")
    ar = 4 * (2 * 7 / 8 * 2 * 4096 * D) / (2 * v6e.ici_link_bandwidth)
    assert evaluate("9.1", ar, variant=params).correct
    assert not evaluate("9.1", AR1, variant=params).correct
    # 8 chips: twice the group (16) would split the 8 KV heads, so no such hint
    assert "not 16" not in evaluate("9.1", ar * (15 / 16) / (7 / 8), variant=params).message
    four = {"tp": 4, "chip": "tpu-v5e", "n_seq": 4, "seq_len": 2048}
    ar4 = 4 * (2 * 3 / 4 * 2 * 8192 * D) / (2 * get_chip("tpu-v5e").ici_link_bandwidth)
    assert "(tp = 4), not 8" in evaluate("9.1", ar4 * (7 / 8) / (3 / 4), variant=four).message


def test_9_2_variant():
    params = {"chip": "gpu-b200", "tokens": 8192, "tp": 4}
    b200 = get_chip("gpu-b200")
    on, comm = layer_times(b200, 8192, 8192, 4, b200.ici_links * b200.ici_link_bandwidth)
    assert evaluate("9.2", comm / (on + comm), variant=params).correct
    assert "whole step" in evaluate("9.2", comm / on, variant=params).message
    v5p_on, v5p_comm = layer_times(v5p, 8192, 8192, 4, 2 * v5p.ici_link_bandwidth)
    assert "for a B200 node" in evaluate("9.2", v5p_comm / (v5p_on + v5p_comm),
                                         variant=params).message


def test_9_4_variant():
    params = {"lead": (16,), "rows": 300, "cols": 100}
    right = 16 * 304 * 128 * 4
    assert evaluate("9.4", right, variant=params).correct
    assert "(300) is padded too" in evaluate("9.4", 16 * 300 * 128 * 4, variant=params).message
    # 100 -> 128 is not a doubling: padding only the rows and using 2 bytes differ here
    assert "(100) is padded too" in evaluate("9.4", 16 * 304 * 100 * 4, variant=params).message
    assert "4 bytes each" in evaluate("9.4", 16 * 304 * 128 * 2, variant=params).message


def test_drawn_traces_and_programs():
    from scalebook.exercises import get_exercise
    for (trace,) in get_exercise("9.5").drawn_cases(b"spec", n=30):
        assert slowest_op(trace) == get_exercise("9.5").reference(trace)
    for (text,) in get_exercise("9.6").drawn_cases(b"spec", n=6):
        assert n_fusions(text) == get_exercise("9.6").reference(text)


def test_9_6_a_count_of_every_fusion_fails_early_and_drawn_programs_nest_too():
    """The commonest slip, counting every " fusion(" of the text, fails on the second
    program (the hand-written nested one), not only at the end; and the programs drawn per
    student include nested fusions too (one draw in six)."""
    import random

    from scalebook import hlo
    from scalebook.exercises import ch09, get_exercise

    r = evaluate("9.6", lambda t: t.count(" fusion("))
    assert r.status == "wrong" and "nested_fusion" in r.message, r
    assert list(get_exercise("9.6").cases)[1] == (ch09._NESTED_FUSION,)

    class Nested(random.Random):
        def random(self):
            return 0.0

    (drawn,) = ch09._gen96(Nested(3))
    assert drawn.count(" fusion(") > hlo.count_fusions(drawn) >= 1
    assert n_fusions(drawn) == hlo.count_fusions(drawn)



def test_9_2_and_9_4_slips_students_made_get_their_hints():
    """A student's report: these slips got only "too small" or another slip's hint."""
    from scalebook import profiling
    from scalebook.exercises.ch09 import _share_92
    right = _share_92()
    assert "count all four" in evaluate("9.2", right / 2).message
    assert "forward pass alone" in evaluate("9.2", _share_92(forward_only=True)).message
    shape = (32, 8, 100, 64)
    turned = profiling.padded_bytes(shape, "float32", (128, 8))   # 100 -> 128, 64 kept
    assert "not the other way round" in evaluate("9.4", turned).message
    elements = profiling.padded_bytes(shape, "float32", (8, 128)) // 4
    assert "count of elements" in evaluate("9.4", elements).message


def test_9_6_counts_of_lines_or_called_computations_get_their_hints():
    import re as _re
    r = evaluate("9.6", lambda t: sum("fusion" in line for line in t.splitlines()))
    assert "lines that contain 'fusion'" in r.message, r
    r = evaluate("9.6", lambda t: len(set(_re.findall(r"calls=%?([\w.\-]+)", t))))
    assert "computations that fusions call" in r.message, r


def test_9_7_with_the_chapters_axis_names_gets_a_hint():
    def with_data_model(x, w1, w2):
        h = jax.nn.relu(x @ w1)
        h = jax.lax.with_sharding_constraint(h, P(("data", "model"), None))
        return h @ w2
    r = evaluate("9.7", with_data_model)
    assert r.status == "wrong" and "axes 'x' and 'y'" in r.message, r


def test_9_8_clipping_at_the_threshold_itself_is_rejected():
    """"Above 0.1" does not clip at lr = 0.1: a >= slip gave the right numbers at every
    learning rate the check tried, and both the notebook's check and the grader's passed
    it."""
    at_or_above = lambda w, g, lr: w - lr * jnp.where(lr >= 0.1, jnp.clip(g, -1.0, 1.0), g)
    r = evaluate("9.8", lambda: jax.jit(at_or_above))
    assert r.status == "wrong" and "lr=0.1 " in r.message and "not clipped" in r.message, r
    assert evaluate("9.8", lambda: jax.jit(clipped_update)).correct
    from scalebook.exercises import get_exercise
    ex = get_exercise("9.8")
    for seed in (1, 2):
        assert not ex.evaluate_exported(ex.export_programs(lambda: jax.jit(at_or_above)),
                                        seed).correct
        assert ex.evaluate_exported(ex.export_programs(lambda: jax.jit(clipped_update)),
                                    seed).correct


def test_9_4_both_minor_dimensions_padded_to_128_gets_its_hint():
    """Padding the second-minor dimension to 128 as well (100 -> 128) is a slip of its own:
    it got only a plain "not yet"."""
    r = evaluate("9.4", 32 * 8 * 128 * 128 * 4)
    assert r.status == "wrong" and "multiple of 8, not of 128" in r.message, r
    params = {"lead": (16,), "rows": 300, "cols": 100}
    r = evaluate("9.4", 16 * 384 * 128 * 4, variant=params)
    assert "(300) is padded to a multiple of 8, not of 128" in r.message, r


def test_9_6_a_count_that_skips_call_instructions_is_rejected_with_its_hint():
    """The statement counts the fusions of what a call runs; no program of the check had a
    call (XLA:CPU inlines them), so a count that follows loops and conditionals only
    passed."""
    def no_calls(text):
        comps, current, entry = defaultdict(list), None, None
        for line in text.splitlines():
            head = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
            if head and "=" not in line.split("(")[0]:
                current = head.group(2)
                entry = current if head.group(1) else entry
            elif current and " = " in line:
                comps[current].append(line)
        todo, seen, count = [entry], {entry}, 0
        while todo:
            for line in comps[todo.pop()]:
                op = re.search(r"\s([a-z][\w\-]*)\(", " " + line.split(" = ", 1)[1]).group(1)
                count += op == "fusion"
                if op in ("while", "conditional"):
                    called = re.findall(r"(?:body|condition|true_computation|"
                                        r"false_computation)=%?([\w.\-]+)", line)
                    for group in re.findall(r"branch_computations=\{([^}]*)\}", line):
                        called += re.findall(r"%?([\w.\-]+)", group)
                    for c in called:
                        if c not in seen:
                            seen.add(c)
                            todo.append(c)
        return count
    r = evaluate("9.6", no_calls)
    assert r.status == "wrong" and "with_call" in r.message and "to_apply" in r.message, r
