"""Timing helpers: measure what the machine running the notebook really does.

Timings differ from run to run and machine to machine, so notebook cells that print them
are excluded from nbval's output comparison (tag ``nbval-ignore-output``). What is measured
(each operation's name, FLOPs and bytes) does not change: :func:`roofline_operations` lists
it without timing anything, so a notebook can print that part in a compared cell.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from .units import check_positive_int

__all__ = ["Operation", "Measurement", "matmul_operation", "elementwise_operation",
           "roofline_operations", "time_call", "measure_matmul", "measure_elementwise",
           "measure_roofline", "GPU_MEASUREMENTS_DIR", "stored_gpu_measurements"]

#: Where tools/gpu_measure.py stores what it measured on a machine with NVIDIA GPUs: one
#: JSON file per machine, shipped with the package (chapter 11 shows what is there).
GPU_MEASUREMENTS_DIR = Path(__file__).resolve().parent / "data" / "gpu"


MATMUL_SIZES = (32, 64, 128, 256, 512, 1024)
VECTOR_SIZES = (2**20, 2**22, 2**24)


@dataclass(frozen=True)
class Operation:
    """What one measurement runs: its name, FLOPs and HBM bytes (no timing)."""

    name: str
    flops: float
    nbytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes


@dataclass(frozen=True)
class Measurement(Operation):
    """An :class:`Operation` and the median wall time it took."""

    seconds: float = 0.0

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds

    @property
    def bytes_per_second(self) -> float:
        return self.nbytes / self.seconds


def time_call(fn, *args, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time in seconds of ``fn(*args)``, waiting for JAX's asynchronous result."""
    import jax

    check_positive_int("repeats", repeats)
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_operation(n: int, dtype="float32") -> Operation:
    """An n x n by n x n matmul: 2 n^3 FLOPs, 3 n^2 elements moved (intensity n / 6 in f32)."""
    import jax.numpy as jnp

    n = check_positive_int("n", n)
    return Operation(f"matmul {n}x{n}", 2.0 * n**3, 3.0 * n * n * jnp.dtype(dtype).itemsize)


def elementwise_operation(n: int, dtype="float32") -> Operation:
    """y = 2 x + 1 over n elements: 2 FLOPs per element, n read and n written (0.25 in f32)."""
    import jax.numpy as jnp

    n = check_positive_int("n", n)
    return Operation(f"2x+1 on {n:,}", 2.0 * n, 2.0 * n * jnp.dtype(dtype).itemsize)


def roofline_operations(matmul_sizes=MATMUL_SIZES, vector_sizes=VECTOR_SIZES,
                        dtype="float32") -> list[Operation]:
    """The operations :func:`measure_roofline` times, in its order, without timing them."""
    return ([matmul_operation(n, dtype) for n in matmul_sizes]
            + [elementwise_operation(n, dtype) for n in vector_sizes])


def _timed(op: Operation, seconds: float) -> Measurement:
    return Measurement(op.name, op.flops, op.nbytes, seconds)


def measure_matmul(n: int, dtype="float32", repeats: int = 5) -> Measurement:
    """Time an n x n by n x n matmul on the default device (see :func:`matmul_operation`)."""
    import jax
    import jax.numpy as jnp

    import numpy as np

    op = matmul_operation(n, dtype)
    dt = jnp.dtype(dtype)
    # drawn on the host and placed: jax.random would compile a program for every size
    rng = np.random.default_rng(0)
    a, b = (jax.device_put(rng.standard_normal((n, n)).astype(dt)) for _ in range(2))
    f = jax.jit(jnp.matmul)
    return _timed(op, time_call(f, a, b, repeats=repeats))


def measure_elementwise(n: int, dtype="float32", repeats: int = 5) -> Measurement:
    """Time y = 2 x + 1 over n elements, in place (the input buffer is donated and reused).

    2 FLOPs per element; n elements read and n written. Donating the buffer avoids timing
    the allocation of a fresh output, which on some machines costs more than the arithmetic.
    """
    import jax
    import jax.numpy as jnp

    op = elementwise_operation(n, dtype)
    dt = jnp.dtype(dtype)
    import numpy as np

    f = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)
    x = jax.device_put(np.zeros((n,), dt))          # placed: jnp.zeros compiles per size
    x = jax.block_until_ready(f(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x = jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t0)
    return _timed(op, statistics.median(times))


def measure_roofline(matmul_sizes=MATMUL_SIZES, vector_sizes=VECTOR_SIZES,
                     repeats: int = 5) -> list[Measurement]:
    """Matmuls of growing size (rising intensity) and large elementwise ops (intensity 0.25).

    Times exactly the operations of :func:`roofline_operations`, in the same order.
    """
    out = [measure_matmul(n, repeats=repeats) for n in matmul_sizes]
    out += [measure_elementwise(n, repeats=repeats) for n in vector_sizes]
    return out


def stored_gpu_measurements() -> list[dict]:
    """The GPU measurements stored with the package, oldest file name first: one dict per
    machine with ``device_kind``, ``device_count``, ``date``, ``jax_version``, ``chip`` (the
    book's name, or None), ``matmul`` (rows of n, seconds, FLOP/s), ``matmul_best_fraction``
    (the best FLOP/s over the chip's bf16 peak), ``copy_bandwidth`` (bytes/s) and
    ``all_reduce`` (rows of bytes, seconds, bus bandwidth; empty on one GPU). Empty when
    nothing has been measured yet; a file the script wrote on a CPU (to test itself) is
    left out."""
    if not GPU_MEASUREMENTS_DIR.is_dir():
        return []
    found = [json.loads(p.read_text()) for p in sorted(GPU_MEASUREMENTS_DIR.glob("*.json"))]
    return [r for r in found if r.get("platform") == "gpu"]
