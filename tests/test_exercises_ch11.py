"""Chapter 11's exercise checks accept right answers, reject wrong ones, and never raise.

The right answers here are worked by hand, independently of scalebook/exercises/ch11.py.
What the tests require of every exercise (tests/exercise_harness.py; README, "Exercises"):

* RIGHT[id]: the answer, worked by hand here (numeric ones are also tried at 0.9 and 1.1 x
  their tolerance: accepted and rejected);
* WRONG[id]: the typical mistakes, each rejected with a hint, not a bare "wrong";
* HINTS[id]: (mistake, words its hint must contain) pairs. The first case should tell the
  typical mistakes apart (round vs ceil, a missing factor 2 vs a missing byte size); with
  all_hints=True every hint the exercise defines must be reached by one of them, so a hint
  that a more generic one always beats fails the tests;
* a code exercise: tested on at least two shapes, in a test of its own below.
"""

import pytest

from exercise_harness import standard_tests
from scalebook.exercises import evaluate

RIGHT: dict = {}   # id -> the right answer
WRONG: dict = {}   # id -> [typical wrong answers]
HINTS: dict = {}   # id -> [(wrong answer, words of its hint)]

globals().update(standard_tests(11, RIGHT, WRONG, HINTS, all_hints=True))
