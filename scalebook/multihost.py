"""Several JAX processes on one machine, the way a multi-host TPU slice or GPU cluster runs
one program (chapter 10).

:func:`run_local` starts ``num_processes`` Python processes on this machine, each with
``devices_per_process`` CPU devices, and waits for them. Each runs :func:`worker`: it calls
``jax.distributed.initialize`` (one coordinator on localhost), builds one mesh over the
devices of every process, assembles a global batch from each process's own rows with
``jax.make_array_from_process_local_data``, sums it with one jitted program (whose
all-reduce crosses the processes: XLA:CPU sends it through Gloo), gathers the whole batch
to every process with ``multihost_utils.process_allgather``, and prints what it saw as one
JSON line. :func:`run_local` returns those reports in process order, or raises
``RuntimeError`` with the processes' last messages if one fails or the run takes longer
than ``timeout`` seconds.

``python -m scalebook.multihost PROCESS_ID NUM_PROCESSES PORT DEVICES_PER_PROCESS`` runs
one worker, as :func:`run_local` does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from .units import check_positive_int

__all__ = ["worker", "run_local", "ROW_WIDTH"]

ROW_WIDTH = 4          # columns of the batch; each device holds one row


def worker(process_id: int, num_processes: int, port: int, devices_per_process: int) -> dict:
    """One process of a multi-process run; returns (and prints as JSON) what it saw.

    Process ``p`` contributes ``devices_per_process`` rows, row ``r`` being
    ``100 p + ROW_WIDTH r + [0, 1, ..., ROW_WIDTH - 1]``, so that the global sum is known.
    """
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", devices_per_process)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # On a TPU slice or a SLURM cluster jax.distributed.initialize() finds all three by itself
    jax.distributed.initialize(coordinator_address=f"localhost:{port}",
                               num_processes=num_processes, process_id=process_id)

    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from . import hlo

    mesh = jax.make_mesh((jax.device_count(),), ("data",))          # every process's devices
    rows = np.arange(devices_per_process * ROW_WIDTH, dtype=np.float32)
    local = rows.reshape(devices_per_process, ROW_WIDTH) + 100 * jax.process_index()
    batch = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
    total_fn = jax.jit(lambda b: b.sum(), out_shardings=NamedSharding(mesh, P()))
    compiled = total_fn.lower(batch).compile()
    total = compiled(batch)
    try:
        np.asarray(batch)                       # the whole array is not on this process
        fetch = "fetched"
    except Exception as e:                      # noqa: BLE001 (JAX's message is the point)
        fetch = f"{type(e).__name__}: {str(e).split('. ')[0]}."
    whole = multihost_utils.process_allgather(batch, tiled=True)
    report = {
        "process_index": jax.process_index(), "process_count": jax.process_count(),
        "global_devices": jax.device_count(), "local_devices": jax.local_device_count(),
        "local_device_ids": [d.id for d in jax.local_devices()],
        "local_rows": list(local.shape), "global_shape": list(batch.shape),
        "local_shards": [list(s.data.shape) for s in batch.addressable_shards],
        "fully_addressable": bool(batch.is_fully_addressable),
        "collectives": [(r.kind, r.group_size) for r in hlo.collectives(compiled)],
        "total": float(total), "fetch_whole_array": fetch,
        "gathered_shape": list(whole.shape), "gathered_sum": float(whole.sum()),
    }
    print(json.dumps(report), flush=True)
    jax.distributed.shutdown()
    return report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_local(num_processes: int = 2, devices_per_process: int = 4,
              timeout: float = 120.0) -> list:
    """Run :func:`worker` in ``num_processes`` new processes on this machine (CPU only) and
    return their reports, in process order."""
    num_processes = check_positive_int("num_processes", num_processes)
    devices_per_process = check_positive_int("devices_per_process", devices_per_process)
    if num_processes < 2:
        raise ValueError(f"num_processes must be at least 2 for a multi-process run; "
                         f"got {num_processes}")
    port = _free_port()
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(p for p in (package_root,
                                                      os.environ.get("PYTHONPATH")) if p))
    procs = [subprocess.Popen([sys.executable, "-m", "scalebook.multihost", str(i),
                               str(num_processes), str(port), str(devices_per_process)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
             for i in range(num_processes)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        for p in procs:
            p.communicate()
        raise RuntimeError(f"the {num_processes} processes did not finish within "
                           f"{timeout:g} s") from None
    reports = []
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if p.returncode != 0 or not lines:
            tail = "\n".join(err.strip().splitlines()[-5:])
            raise RuntimeError(f"process {i} of {num_processes} failed (exit code "
                               f"{p.returncode}):\n{tail}")
        reports.append(json.loads(lines[-1]))
    return sorted(reports, key=lambda r: r["process_index"])


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: python -m scalebook.multihost PROCESS_ID NUM_PROCESSES PORT "
                         "DEVICES_PER_PROCESS")
    worker(*(int(a) for a in sys.argv[1:]))
