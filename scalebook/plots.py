"""The book's figures: one colour per chip, log-log rooflines, labelled units."""

from __future__ import annotations

import numpy as np

from .hardware import get_chip
from .roofline import attainable_flops
from .units import sci

__all__ = ["CHIP_COLORS", "chip_color", "roofline_plot"]

CHIP_COLORS = {
    "tpu-v4": "#8c564b",
    "tpu-v5e": "#1f77b4",
    "tpu-v5p": "#17becf",
    "tpu-v6e": "#9467bd",
    "gpu-a100": "#bcbd22",
    "gpu-h100": "#2ca02c",
    "gpu-h200": "#d62728",
    "gpu-b200": "#ff7f0e",
}


def chip_color(chip) -> str:
    return CHIP_COLORS.get(get_chip(chip).name, "#333333")


def roofline_plot(chips, points=(), ax=None, dtype: str = "bf16", intensity_range=(0.1, 1e4),
                  title: str | None = None):
    """Draw the rooflines of ``chips`` on log-log axes and place operations on them.

    ``points`` is a sequence of (label, intensity in FLOPs/byte). Each is marked on every
    chip's roof at the FLOP/s it could attain there. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    lo, hi = intensity_range
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    chips = [get_chip(c) for c in chips]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    for chip in chips:
        peak = chip.peak_flops(dtype)
        color = chip_color(chip)
        ax.loglog(x, attainable_flops(x, peak, chip.hbm_bandwidth), color=color, lw=2,
                  label=f"{chip.display_name}: peak {sci(peak)} FLOP/s")
        crit = peak / chip.hbm_bandwidth
        ax.axvline(crit, color=color, ls=":", lw=1)
        ax.annotate(f"I* = {crit:.0f}", (crit, peak), textcoords="offset points", xytext=(4, -14),
                    color=color, fontsize=8)
        for k, (label, intensity) in enumerate(points):
            y = attainable_flops(intensity, peak, chip.hbm_bandwidth)
            ax.plot([intensity], [y], markers[k % len(markers)], color=color, ms=7,
                    markeredgecolor="black", markeredgewidth=0.5)
    for k, (label, intensity) in enumerate(points):
        ax.plot([], [], markers[k % len(markers)], color="white", markeredgecolor="black",
                label=f"{label} (I = {sci(intensity)})")
    ax.set_xlabel("arithmetic intensity (FLOPs per HBM byte)")
    ax.set_ylabel(f"attainable {dtype} FLOP/s")
    ax.set_xlim(lo, hi)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    return ax
