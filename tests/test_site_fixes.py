"""tools/site_fixes.py: the figure description read back from a PNG without PIL."""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import site_fixes  # noqa: E402


def test_the_description_matplotlib_stores_is_read_back(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    text = "Rooflines of a TPU v5e: FLOP/s against FLOPs per byte (µs, ×2)."
    fig.savefig(tmp_path / "a.png", metadata={"Description": text})
    fig.savefig(tmp_path / "b.png")
    plt.close(fig)
    assert site_fixes.png_description(tmp_path / "a.png") == text
    assert site_fixes.png_description(tmp_path / "b.png") is None
    (tmp_path / "c.png").write_bytes(b"not a png")
    assert site_fixes.png_description(tmp_path / "c.png") is None
    assert site_fixes.png_description(tmp_path / "missing.png") is None
