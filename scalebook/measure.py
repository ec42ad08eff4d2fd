"""Timing helpers: measure what the machine running the notebook really does.

Timings differ from run to run and machine to machine, so notebook cells that print them
are excluded from nbval's output comparison (tag ``nbval-ignore-output``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from .units import check_positive_int

__all__ = ["Measurement", "time_call", "measure_matmul", "measure_elementwise", "measure_roofline"]


@dataclass(frozen=True)
class Measurement:
    name: str
    flops: float
    nbytes: float
    seconds: float

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes

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


def measure_matmul(n: int, dtype="float32", repeats: int = 5) -> Measurement:
    """Time an n x n by n x n matmul on the default device: 2 n^3 FLOPs, 3 n^2 elements moved."""
    import jax
    import jax.numpy as jnp

    n = check_positive_int("n", n)
    dt = jnp.dtype(dtype)
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.random.normal(k1, (n, n), dt)
    b = jax.random.normal(k2, (n, n), dt)
    f = jax.jit(jnp.matmul)
    seconds = time_call(f, a, b, repeats=repeats)
    return Measurement(f"matmul {n}x{n}", 2.0 * n**3, 3.0 * n * n * dt.itemsize, seconds)


def measure_elementwise(n: int, dtype="float32", repeats: int = 5) -> Measurement:
    """Time y = 2 x + 1 over n elements, in place (the input buffer is donated and reused).

    2 FLOPs per element; n elements read and n written. Donating the buffer avoids timing
    the allocation of a fresh output, which on some machines costs more than the arithmetic.
    """
    import jax
    import jax.numpy as jnp

    n = check_positive_int("n", n)
    dt = jnp.dtype(dtype)
    f = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)
    x = jnp.zeros((n,), dt)
    x = jax.block_until_ready(f(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x = jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t0)
    return Measurement(f"2x+1 on {n:.0e}", 2.0 * n, 2.0 * n * dt.itemsize, statistics.median(times))


def measure_roofline(matmul_sizes=(32, 64, 128, 256, 512, 1024), vector_sizes=(2**20, 2**22, 2**24),
                     repeats: int = 5) -> list[Measurement]:
    """Matmuls of growing size (rising intensity) and large elementwise ops (intensity 0.25)."""
    out = [measure_matmul(n, repeats=repeats) for n in matmul_sizes]
    out += [measure_elementwise(n, repeats=repeats) for n in vector_sizes]
    return out
