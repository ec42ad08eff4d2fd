"""The grader's gradebook: late submissions, roster details and LMS exports.

Used by ``python -m scalebook.grade`` (its options ``--submitted``, ``--deadline``,
``--late-policy``, ``--roster-info`` and ``--export``); nothing here runs student code.

Late submissions. Each student's submission time comes from a CSV (``student`` and
``submitted`` columns; an LMS's export) or from the notebook files' modification times.
Every time must carry a zone (``2025-03-01T17:00:00+01:00``, ``...Z``); a time without
one is refused, since nobody could say when it was. A submission after the deadline is
late by whole days, a partial day counting as a whole one (one hour late is one day).
The policy is ``none`` (lateness recorded, no penalty), ``zero`` (a late submission
earns nothing) or ``P%/day`` with an optional cap (``10%/day,cap=50%``): that share of
the points earned is taken off per late day, never more than the cap (100% without one).
A notebook with no submission time is flagged and not penalised.

Exports. ``canvas.csv`` follows the Canvas gradebook's CSV (the columns Student, ID, SIS
User ID, SIS Login ID, Section, then one column per assignment named "Title (assignment
id)", and a "Points Possible" row); ``gradescope.csv`` has the roster columns Gradescope
maps (First Name, Last Name, SID, Email, Sections) and, for the assignment, the columns
of a Gradescope grade export (score, Max Points, Submission Time, Lateness (H:M:S)). The
names, ids, emails and sections come from ``--roster-info``; an unknown one is left
empty.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

__all__ = ["LatePolicy", "parse_late_policy", "parse_time", "read_submitted",
           "late_days", "Lateness", "lateness", "Deadline", "Person",
           "read_roster_info", "canvas_csv", "gradescope_csv", "EXPORTS",
           "parse_exports", "safe_cell"]

DAY = timedelta(days=1)


# --------------------------------------------------------------------------------------
# Times and the late policy
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LatePolicy:
    kind: str                 # "none", "zero" or "per-day"
    per_day: float = 0.0      # share of the points taken off per late day
    cap: float = 1.0          # the most that is ever taken off

    def penalty(self, days: int) -> float:
        """The share of the points taken off a submission ``days`` late."""
        if days <= 0 or self.kind == "none":
            return 0.0
        if self.kind == "zero":
            return 1.0
        return min(self.cap, self.per_day * days, 1.0)

    def describe(self) -> str:
        if self.kind == "none":
            return "no penalty for lateness"
        if self.kind == "zero":
            return "a late submission earns no points"
        cap = "" if self.cap >= 1 else f", at most {_pct(self.cap)}"
        return f"{_pct(self.per_day)} of the points off per late day{cap}"


def _pct(x: float) -> str:
    return f"{round(100 * x, 4):g}%"


_PER_DAY = re.compile(r"(\d+(?:\.\d+)?)\s*%\s*/\s*day"
                      r"(?:\s*,\s*cap\s*=\s*(\d+(?:\.\d+)?)\s*%)?")


def parse_late_policy(text: str) -> LatePolicy:
    """``none``, ``zero``, ``10%/day`` or ``10%/day,cap=50%``; anything else is
    refused."""
    t = str(text).strip().lower()
    if t in ("none", "zero"):
        return LatePolicy(t)
    m = _PER_DAY.fullmatch(t)
    if not m:
        raise ValueError(f"late policy {text!r} not understood: give none, zero, "
                         f"P%/day or P%/day,cap=C% (e.g. 10%/day,cap=50%)")
    per_day = float(m.group(1)) / 100
    cap = float(m.group(2)) / 100 if m.group(2) else 1.0
    if not 0 < per_day <= 1 or not 0 < cap <= 1:
        raise ValueError(f"late policy {text!r}: the share per day and the cap must be "
                         f"above 0% and at most 100%")
    return LatePolicy("per-day", per_day, cap)


# "2025-03-01 12:34:56 -0800" (a space before the zone, as some LMS exports write it)
_SPACE_ZONE = re.compile(r"(\d)\s+([+-]\d\d:?\d\d)$")


def parse_time(text: str, what: str = "time") -> datetime:
    """An ISO-8601 time with its zone (``2025-03-01T17:00+01:00``, ``...Z``); a time
    without a zone, or not a time, is refused with a message naming ``what``."""
    raw = str(text).strip()
    try:
        t = datetime.fromisoformat(_SPACE_ZONE.sub(r"\1\2", raw))
    except ValueError:
        raise ValueError(f"{what}: {raw!r} is not an ISO-8601 time "
                         f"(e.g. 2025-03-01T17:00:00+01:00)") from None
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{what}: {raw!r} has no time zone; write it with one, "
                         f"e.g. {t.isoformat()}+00:00 or {t.isoformat()}Z")
    return t


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]+", " ", str(name).strip().lower())


_TIME_COLUMNS = ("submitted", "submitted at", "submission time", "time", "timestamp")


def read_submitted(path) -> dict[str, datetime]:
    """Student -> submission time, from a CSV with a header naming a ``student`` column
    and a ``submitted`` one (or ``submission time``, ``timestamp``, ``time``). An empty
    time leaves the student out (flagged later); a bad one is refused with its line."""
    path = Path(path)
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path}: empty; expected a header with student,submitted")
    head = [_norm(h) for h in rows[0]]
    if "student" not in head or not any(c in head for c in _TIME_COLUMNS):
        found = ", ".join(rows[0]) or "nothing"
        raise ValueError(f"{path}: the first line must name a 'student' and a "
                         f"'submitted' column (found {found})")
    si = head.index("student")
    ti = next(head.index(c) for c in _TIME_COLUMNS if c in head)
    out: dict[str, datetime] = {}
    for n, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        student = row[si].strip() if si < len(row) else ""
        when = row[ti].strip() if ti < len(row) else ""
        if not student:
            raise ValueError(f"{path}, line {n}: no student")
        if student in out:
            raise ValueError(f"{path}, line {n}: {student!r} appears twice")
        if when:
            out[student] = parse_time(when, f"{path}, line {n}")
    return out


def late_days(submitted: datetime, deadline: datetime) -> int:
    """Whole days after the deadline, a partial day counting as one; 0 if on time."""
    late = submitted - deadline
    if late <= timedelta(0):
        return 0
    return math.ceil(late / DAY)


def _hms(delta: timedelta) -> str:
    s = max(0, int(delta.total_seconds()))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass
class Lateness:
    submitted: datetime | None        # None: no time known (flagged, no penalty)
    days: int | None                  # whole late days; None without a time
    penalty: float                    # share of the points taken off
    note: str                         # what the feedback says
    deadline: datetime | None = None

    def after(self, total: float) -> float:
        return round(total * (1 - self.penalty), 4)

    @property
    def late_hms(self) -> str:
        if self.submitted is None or self.deadline is None:
            return ""
        return _hms(self.submitted - self.deadline)


@dataclass
class Deadline:
    """The deadline, the late policy and the submission times known (student ->
    time)."""
    deadline: datetime
    policy: LatePolicy
    times: dict

    def of(self, student: str, handed_in: bool) -> Lateness | None:
        return lateness(student, handed_in, self.times, self.deadline, self.policy)


def lateness(student: str, handed_in: bool, times: dict[str, datetime],
             deadline: datetime, policy: LatePolicy) -> Lateness | None:
    """How late one student's submission was and what it costs (None: nothing handed
    in)."""
    if not handed_in:
        return None
    when = times.get(student)
    if when is None:
        return Lateness(None, None, 0.0,
                        "No submission time was found for this notebook, so no late "
                        "penalty was applied; it is flagged for the instructor.",
                        deadline)
    days = late_days(when, deadline)
    pen = policy.penalty(days)
    at = f"Handed in {when.isoformat()}; the deadline was {deadline.isoformat()}"
    if days == 0:
        return Lateness(when, 0, 0.0, f"{at}: on time, no late penalty.", deadline)
    late = (f"{days} day{'s' if days != 1 else ''} late "
            f"(a partial day counts as a whole one)")
    if pen == 0:
        how = f"late policy: {policy.describe()}"
    else:
        how = (f"late policy: {policy.describe()}, so {_pct(pen)} of the points were "
               f"taken off")
    return Lateness(when, days, pen, f"{at}: {late}; {how}.", deadline)


# --------------------------------------------------------------------------------------
# Roster details and the LMS exports
# --------------------------------------------------------------------------------------

@dataclass
class Person:
    student: str                      # the id the assignment was made with
    name: str = ""
    first: str = ""
    last: str = ""
    sis_id: str = ""
    sis_login: str = ""
    canvas_id: str = ""
    email: str = ""
    section: str = ""

    @property
    def full_name(self) -> str:
        return self.name or " ".join(x for x in (self.first, self.last) if x)

    @property
    def sortable_name(self) -> str:
        """Canvas's "Last, First" when both halves are known, else the name as given."""
        if self.first and self.last:
            return f"{self.last}, {self.first}"
        return self.full_name


# --roster-info column names (compared lower-case, _ and - as spaces) -> Person field
_ROSTER_COLUMNS = {
    "student": "student", "student id": "student", "roster id": "student",
    "name": "name", "full name": "name", "student name": "name",
    "first name": "first", "first": "first", "given name": "first",
    "last name": "last", "last": "last", "family name": "last", "surname": "last",
    "sis id": "sis_id", "sis user id": "sis_id", "sid": "sis_id",
    "sis login id": "sis_login", "sis login": "sis_login", "login": "sis_login",
    "canvas id": "canvas_id", "canvas user id": "canvas_id",
    "email": "email", "e mail": "email", "email address": "email",
    "section": "section", "sections": "section",
}


def read_roster_info(path) -> dict[str, Person]:
    """Student id -> Person, from a CSV whose header names a ``student`` column (the ids
    the assignment was made with) and any of name (or first name, last name), sis id,
    sis login id, canvas id, email, section. Unknown columns are refused, so that a
    misspelt one is not silently left out."""
    path = Path(path)
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path}: empty; expected a header with student, name, "
                         f"email...")
    fields = []
    for h in rows[0]:
        field = _ROSTER_COLUMNS.get(_norm(h))
        if field is None:
            raise ValueError(f"{path}: column {h!r} not understood; the columns are "
                             f"student, name (or first name, last name), sis id, "
                             f"sis login id, canvas id, email, section")
        fields.append(field)
    if "student" not in fields:
        raise ValueError(f"{path}: no 'student' column (the ids the assignment was "
                         f"made with)")
    people: dict[str, Person] = {}
    for n, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        values = {f: (row[i].strip() if i < len(row) else "")
                  for i, f in enumerate(fields)}
        p = Person(**values)
        if not p.student:
            raise ValueError(f"{path}, line {n}: no student id")
        if p.student in people:
            raise ValueError(f"{path}, line {n}: {p.student!r} appears twice")
        people[p.student] = p
    return people


EXPORTS = ("canvas", "gradescope")


def parse_exports(values) -> list[str]:
    """``--export canvas --export gradescope`` or ``--export canvas,gradescope``."""
    out = []
    for v in values or []:
        for name in (x.strip().lower() for x in str(v).split(",")):
            if not name:
                continue
            if name not in EXPORTS:
                raise ValueError(f"--export {name!r}: the exports are "
                                 f"{', '.join(EXPORTS)}")
            if name not in out:
                out.append(name)
    return out


def safe_cell(text: str) -> str:
    """A text cell a spreadsheet will not run as a formula (=, +, -, @ at its start)."""
    text = str(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _fmt(x: float) -> str:
    return f"{round(x, 4):g}"


def _csv(rows) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def canvas_csv(book: list[dict], column: str, possible: float,
               people: dict[str, Person]) -> str:
    """The Canvas gradebook CSV: Student, ID, SIS User ID, SIS Login ID, Section and one
    assignment column named ``column`` ("Week 2 (4567)" matches Canvas's assignment
    4567; a name without the id makes Canvas create a new assignment), a "Points
    Possible" row, then a row per student with the score (after any late penalty). A
    student with no roster details has the assignment's student id as their name and
    empty ids."""
    rows = [["Student", "ID", "SIS User ID", "SIS Login ID", "Section", column],
            ["    Points Possible", "", "", "", "", _fmt(possible)]]
    for r in book:
        p = people.get(r["student"]) or Person(r["student"])
        rows.append([safe_cell(p.sortable_name or p.student), safe_cell(p.canvas_id),
                     safe_cell(p.sis_id), safe_cell(p.sis_login), safe_cell(p.section),
                     _fmt(r["score"])])
    return _csv(rows)


def gradescope_csv(book: list[dict], column: str, possible: float,
                   people: dict[str, Person]) -> str:
    """Gradescope's roster columns (First Name, Last Name, SID, Email, Sections) and the
    assignment's columns as a Gradescope grade export names them: the score (after any
    late penalty), "- Max Points", "- Submission Time", "- Lateness (H:M:S)". A name
    given whole (no first and last name columns) goes into First Name; nothing is
    guessed."""
    rows = [["First Name", "Last Name", "SID", "Email", "Sections", column,
             f"{column} - Max Points", f"{column} - Submission Time",
             f"{column} - Lateness (H:M:S)"]]
    for r in book:
        p = people.get(r["student"]) or Person(r["student"])
        if p.first or p.last:
            first, last = p.first, p.last
        else:
            first, last = p.name or p.student, ""
        late = r.get("late")
        rows.append([safe_cell(first), safe_cell(last), safe_cell(p.sis_id),
                     safe_cell(p.email), safe_cell(p.section), _fmt(r["score"]),
                     _fmt(possible),
                     late.submitted.isoformat() if late and late.submitted else "",
                     late.late_hms if late else ""])
    return _csv(rows)


def utc(ts: float) -> datetime:
    """A file's modification time as an aware datetime."""
    return datetime.fromtimestamp(ts, tz=timezone.utc)
