"""Chapter 11 exercises: gpus. Reference answers are computed from scalebook."""

from __future__ import annotations

from .core import register
from .kinds import ChoiceExercise, CodeExercise, NumericExercise

__all__: list[str] = []
