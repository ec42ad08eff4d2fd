"""Measure, on a machine with NVIDIA GPUs, what chapter 11 models: a bf16 matmul sweep
against the chip's roofline, HBM copy bandwidth, and (with more than one GPU) all-reduces.

    python tools/gpu_measure.py            # on the GPU machine; writes one JSON file
    python tools/gpu_measure.py --out DIR  # somewhere else than the package's data folder

The result goes to ``scalebook/data/gpu/<device>-x<count>.json`` (see
``scalebook.measure.stored_gpu_measurements``), with the device's name as JAX reports it,
the date and the JAX version, so the chapter can say where its numbers came from. On a
machine without a GPU the script refuses (``--allow-cpu`` runs it anyway, for testing the
script itself; such a file says ``"platform": "cpu"`` and the chapter does not show it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The book's chip names for the device names JAX reports (device_kind).
KINDS = {r"H100": "gpu-h100", r"H200": "gpu-h200", r"A100": "gpu-a100", r"B200": "gpu-b200"}


def _chip_name(kind: str):
    for pattern, name in KINDS.items():
        if re.search(pattern, kind):
            return name
    return None


def _time(fn, *args, repeats=5):
    out = fn(*args)
    out.block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn(*args).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return best


def measure(sizes=(1024, 2048, 4096, 8192, 16384), copy_bytes=2**30,
            ar_sizes=(2**20, 2**24, 2**28, 2**30), allow_cpu=False) -> dict:
    import jax
    import jax.numpy as jnp

    devs = jax.devices()
    platform = devs[0].platform
    if platform != "gpu" and not allow_cpu:
        raise SystemExit(f"no GPU here (JAX runs on {platform}); run this on a GPU machine "
                         f"or pass --allow-cpu to test the script")
    kind = devs[0].device_kind
    chip = _chip_name(kind)
    from scalebook.hardware import get_chip
    peak = get_chip(chip).bf16_flops if chip else None
    rows = []
    for n in sizes:
        a = jnp.ones((n, n), jnp.bfloat16)
        f = jax.jit(lambda x, y: x @ y)
        s = _time(f, a, a)
        rows.append({"n": n, "seconds": s, "flops_per_s": 2 * n ** 3 / s})
    best = max(r["flops_per_s"] for r in rows)
    x = jnp.ones((copy_bytes // 2,), jnp.bfloat16)
    s = _time(jax.jit(lambda v: v * 2), x)
    copy_bw = 2 * copy_bytes / s                 # read and write
    ar = []
    if len(devs) > 1:
        from jax.sharding import NamedSharding, PartitionSpec as P
        mesh = jax.make_mesh((len(devs),), ("d",))
        for nbytes in ar_sizes:
            per = nbytes // 4
            v = jax.device_put(jnp.ones((len(devs) * per,), jnp.float32),
                               NamedSharding(mesh, P("d")))
            f = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "d"), mesh=mesh,
                                      in_specs=P("d"), out_specs=P("d")))
            s = _time(f, v)
            n = len(devs)
            ar.append({"bytes": nbytes, "seconds": s,
                       "bus_bandwidth": 2 * (n - 1) / n * nbytes / s})
    return {"device_kind": kind, "device_count": len(devs), "platform": platform,
            "chip": chip, "date": datetime.date.today().isoformat(),
            "jax_version": jax.__version__, "matmul": rows,
            "matmul_best_fraction": best / peak if peak else None,
            "copy_bandwidth": copy_bw, "all_reduce": ar}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "scalebook" / "data" / "gpu")
    parser.add_argument("--allow-cpu", action="store_true")
    parser.add_argument("--small", action="store_true", help="small sizes (a quick test)")
    args = parser.parse_args(argv)
    kw = dict(sizes=(64, 128), copy_bytes=2**20, ar_sizes=(2**12,)) if args.small else {}
    record = measure(allow_cpu=args.allow_cpu, **kw)
    args.out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", record["device_kind"].lower()).strip("-")
    path = args.out / f"{slug}-x{record['device_count']}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
