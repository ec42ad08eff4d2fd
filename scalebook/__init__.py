"""scalebook: the helper package of the book *Scaling LLMs, executably*.

Modules:
  hardware   chip specifications with sources (get_chip)
  roofline   compute / memory / communication time; matmul FLOPs, bytes, intensity
  models     LLaMA-3 configurations (get_model)
  mesh       device set-up for notebooks (setup, make_mesh)
  exercises  self-checking exercises (check)
  plots      the book's figures (roofline plots, chip colours)
  measure    timing helpers for measured rooflines
  units      units and number formatting
"""

from .mesh import make_mesh, setup

__version__ = "0.1.0"
__all__ = ["setup", "make_mesh", "__version__"]
