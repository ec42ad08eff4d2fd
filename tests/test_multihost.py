"""scalebook.multihost: a real multi-process JAX run on this machine (jax.distributed over
localhost, Gloo collectives on CPU)."""

import pytest

from scalebook import multihost


def test_two_processes_see_one_global_array_and_agree_on_its_sum():
    n, d, w = 2, 2, multihost.ROW_WIDTH
    reports = multihost.run_local(num_processes=n, devices_per_process=d, timeout=120)
    assert [r["process_index"] for r in reports] == [0, 1]
    rows = sum(range(d * w)) * n + 100 * d * w * sum(range(n))   # every row, every process
    for r in reports:
        assert r["process_count"] == n and r["global_devices"] == n * d
        assert r["local_devices"] == d and len(r["local_device_ids"]) == d
        assert r["global_shape"] == [n * d, w] and r["local_rows"] == [d, w]
        assert r["local_shards"] == [[1, w]] * d and not r["fully_addressable"]
        assert r["collectives"] == [["all-reduce", n * d]]       # one sum over both processes
        assert r["total"] == r["gathered_sum"] == rows
        assert r["gathered_shape"] == [n * d, w]
        assert r["fetch_whole_array"].startswith("RuntimeError: Fetching value")
    ids = [i for r in reports for i in r["local_device_ids"]]
    assert len(set(ids)) == n * d                                 # global device ids differ


@pytest.mark.parametrize("kwargs,match", [({"num_processes": 1}, "at least 2"),
                                          ({"num_processes": 0}, "num_processes"),
                                          ({"devices_per_process": 0}, "devices_per_process")])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        multihost.run_local(**kwargs)
