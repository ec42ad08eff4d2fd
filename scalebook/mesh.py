"""Device set-up shared by every notebook: 8 simulated CPU devices, or real accelerators.

Call :func:`setup` in the first cell, before anything else touches JAX::

    import scalebook
    scalebook.setup()          # 8 devices; prints what the notebook runs on

JAX fixes its device count when its first computation runs. ``setup`` asks for
``n_devices`` CPU devices before that happens. If the notebook's kernel already ran JAX
with a different count, nothing can change it any more, and ``setup`` raises
:class:`~scalebook.errors.DeviceCountError` saying how to restart, instead of letting
the chapter run silently on one device.

When a machine has exactly ``n_devices`` accelerators (a TPU v5e-8 in Colab, an 8-GPU
node), those are used. With some other number of accelerators (one Colab GPU), the
chapter still needs its 8-device mesh, so it uses the simulated CPU devices and says so.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .errors import DeviceCountError

__all__ = ["setup", "devices", "make_mesh", "require_devices", "Setup", "TESTED_JAX_VERSION",
           "TESTED_VERSIONS", "version_notes", "RestartNeeded"]

# The versions the book's stored outputs come from: the pins in requirements.lock
# (tests/test_packaging.py checks). pyproject.toml declares the wider range the package
# supports; its lower bounds are the oldest versions every chapter was run on
# (tests/test_colab.py runs every chapter on them).
TESTED_VERSIONS = {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "numpy": "2.5.5",
                   "matplotlib": "3.11.2"}
TESTED_JAX_VERSION = TESTED_VERSIONS["jax"]


class RestartNeeded(RuntimeError):
    """The kernel runs a JAX that is no longer the installed one (an install replaced it)."""

_chosen: list | None = None
_figure_hook = None


@dataclass(frozen=True)
class Setup:
    platform: str
    n_devices: int
    simulated: bool
    jax_version: str

    def __str__(self) -> str:
        kind = "simulated CPU devices" if self.simulated else f"{self.platform.upper()} devices"
        return f"JAX {self.jax_version} with {self.n_devices} {kind}"


def _in_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def _restart_advice() -> str:
    if _in_colab():
        return "In Colab: Runtime > Restart session, then run the set-up cell first."
    return "Restart the kernel (Kernel > Restart), then run the set-up cell first."


def _installed(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def version_notes() -> list[str]:
    """What differs from the tested versions (TESTED_VERSIONS), one line each; [] if nothing."""
    import jax

    running = {"jax": jax.__version__, "jaxlib": _installed("jaxlib"),
               "numpy": _installed("numpy"), "matplotlib": _installed("matplotlib")}
    differ = [f"{name} {running[name]}" for name, tested in TESTED_VERSIONS.items()
              if running[name] != tested]
    if not differ:
        return []
    tested = ", ".join(f"{n} {v}" for n, v in TESTED_VERSIONS.items())
    return [f"Note: the book was tested with {tested}; this runs {', '.join(differ)}: "
            "outputs may differ."]


def describe_figure(fig) -> str:
    """A sentence saying what a matplotlib figure shows, from its titles and axis labels
    (the site uses it as the figure's alt text and caption). A figure drawn by
    :mod:`scalebook.diagrams` carries its own caption sentence, which is used instead."""
    own = getattr(fig, "scalebook_caption", None)
    if own:
        return own
    parts = []
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text().strip():
        parts.append(sup.get_text().strip())
    for ax in fig.axes:
        title, x, y = ax.get_title().strip(), ax.get_xlabel().strip(), ax.get_ylabel().strip()
        if not (title or x or y):
            continue
        axes = f"{y or 'values'} against {x}" if x else (y or "")
        parts.append(f"{title}: {axes}" if title and axes else title or axes)
    text = "; ".join(dict.fromkeys(p.replace("\n", " ") for p in parts if p))
    return (text[0].upper() + text[1:] + ".") if text else "A figure drawn by the code above."


def _sharp_described_figures() -> None:
    """In a notebook with matplotlib's inline backend: the book's figure style
    (scalebook.plots.book_style: drawn for the site's column), and figures drawn as 2x PNG
    (sharp on high-density screens, shown at their normal size) with describe_figure's text
    and scalebook.plots.figure_report's measurements stored in the PNG, where the book's
    site reads the text for alt text and tests/test_figures.py the measurements."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None or not hasattr(ip, "display_formatter"):
        return
    import matplotlib

    if "inline" not in str(matplotlib.get_backend()).lower() and "inline" not in \
            str(matplotlib.rcParams.get("backend", "")).lower():
        return
    # Importing the backend sets its own formatters (it does so once, at import): first.
    import matplotlib_inline.backend_inline  # noqa: F401
    from IPython.core.pylabtools import retina_figure
    from matplotlib.figure import Figure

    from .plots import REPORT_KEY, book_style, report_json

    book_style()

    def png(fig):
        # Measured first (a draw without output), then saved with the measurements.
        report = report_json(fig)
        return retina_figure(fig, base64=True, metadata={"Description": describe_figure(fig),
                                                         REPORT_KEY: report})

    def install(*_):
        ip.display_formatter.formatters["image/png"].for_type(Figure, png)

    install()
    # The inline backend may set its own formatter again after this cell (when it finishes
    # configuring itself), so ours is put back before every cell.
    global _figure_hook
    if _figure_hook is not None:
        try:
            ip.events.unregister("pre_run_cell", _figure_hook)
        except ValueError:
            pass
    _figure_hook = install
    ip.events.register("pre_run_cell", install)


def setup(n_devices: int = 8, quiet: bool = False) -> Setup:
    """Give JAX ``n_devices`` devices and report what the notebook runs on.

    Safe to run twice. Raises DeviceCountError if JAX already started with a device
    count that cannot serve an ``n_devices`` mesh.
    """
    global _chosen
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise ValueError(f"n_devices must be a positive integer; got {n_devices!r}")
    import jax

    installed = _installed("jax")
    if installed is not None and installed != jax.__version__:
        # e.g. Colab: an old JAX was imported, then installing scalebook upgraded it on disk.
        raise RestartNeeded(
            f"This kernel runs JAX {jax.__version__}, but JAX {installed} is now installed; "
            "the chapter would fail later with import errors. " + _restart_advice())
    try:
        jax.config.update("jax_num_cpu_devices", n_devices)
    except RuntimeError:
        # JAX has already started. That is fine if it started with what we need.
        pass

    accel = [d for d in jax.devices() if d.platform != "cpu"]
    if len(accel) == n_devices:
        chosen, simulated = accel, False
    else:
        cpus = jax.devices("cpu")
        if len(cpus) != n_devices:
            raise DeviceCountError(
                f"This notebook needs {n_devices} devices, but JAX already started with "
                f"{len(cpus)} CPU device(s) (something ran JAX before the set-up cell). "
                + _restart_advice())
        chosen, simulated = cpus, True
        if accel:
            # e.g. one Colab GPU: arrays should live on the simulated mesh, not the GPU.
            jax.config.update("jax_default_device", cpus[0])
    _chosen = chosen
    _sharp_described_figures()
    info = Setup(platform=chosen[0].platform, n_devices=len(chosen), simulated=simulated,
                 jax_version=jax.__version__)
    if not quiet:
        print(info)
        if accel and simulated:
            print(f"(found {len(accel)} {accel[0].platform.upper()} device(s), not {n_devices}: "
                  f"using simulated CPU devices so the mesh has {n_devices})")
        for line in version_notes():
            print(line)
    return info


def devices() -> list:
    """The devices chosen by :func:`setup` (raises if setup has not run)."""
    if _chosen is None:
        raise DeviceCountError("scalebook.setup() has not run yet: run the notebook's set-up cell first.")
    return list(_chosen)


def require_devices(n: int) -> None:
    """Raise a clear DeviceCountError unless setup chose exactly ``n`` devices."""
    have = len(devices())
    if have != n:
        raise DeviceCountError(f"this code needs {n} devices but the notebook has {have}. " + _restart_advice())


def make_mesh(shape: tuple[int, ...], axis_names: tuple[str, ...], explicit: bool = False):
    """A jax.sharding.Mesh over the set-up devices, e.g. ``make_mesh((2, 4), ("x", "y"))``.

    Axes are ``Auto`` (the compiler propagates shardings) unless ``explicit=True``.
    """
    import math

    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    shape = tuple(shape)
    axis_names = tuple(axis_names)
    if len(shape) != len(axis_names):
        raise ValueError(f"mesh shape {shape} and axis names {axis_names} differ in length")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"mesh shape must be positive integers; got {shape}")
    devs = devices()
    if math.prod(shape) != len(devs):
        raise ValueError(f"a {'x'.join(map(str, shape))} mesh needs {math.prod(shape)} devices; "
                         f"the notebook has {len(devs)}")
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return Mesh(np.array(devs).reshape(shape), axis_names, axis_types=(kind,) * len(shape))
