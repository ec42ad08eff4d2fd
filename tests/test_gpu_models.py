"""Chapter 11's small models: SM peaks and waves (chip_internals), fat trees and rails
(topology), the GPU critical batches and expert widths (parallelism), stored GPU
measurements (measure, tools/gpu_measure.py). Each is checked against a hand derivation."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from scalebook import chip_internals as ci
from scalebook import collectives as coll
from scalebook import hardware, measure, topology
from scalebook import parallelism as par

ROOT = Path(__file__).resolve().parents[1]
H100 = hardware.get_chip("gpu-h100")


def test_sm_peaks():
    assert ci.sm_peak_flops("gpu-h100") == pytest.approx(132 * 4096 * 1.83e9)
    assert ci.sm_vector_flops("gpu-a100") == pytest.approx(108 * 64 * 2 * 1.41e9)
    with pytest.raises(ValueError, match="tensor_flops_per_sm_clock"):
        ci.sm_peak_flops("gpu-b200")
    with pytest.raises(ValueError, match="sm_count"):
        ci.sm_peak_flops("tpu-v5p")
    faster = H100.with_(tensor_clock=2e9)
    assert ci.sm_peak_flops(faster) == pytest.approx(132 * 4096 * 2e9)


def test_implied_sm_clock():
    assert ci.implied_sm_clock("gpu-b200", 8192) == pytest.approx(2.25e15 / (148 * 8192))
    assert ci.implied_sm_clock("gpu-h100", 4096) == pytest.approx(9.89e14 / (132 * 4096))
    with pytest.raises(ValueError, match="positive"):
        ci.implied_sm_clock("gpu-b200", 0)


@pytest.mark.parametrize("B,F,tiles,waves", [
    (64, 28672, 112, 1),            # one row of 112 tiles: 20 of 132 SMs idle
    (384, 14336, 168, 2),           # 36 tiles in the second wave
    (200, 1000, 8, 1),              # partial tiles count: ceil(200/128) ceil(1000/256)
    (4096, 28672, 3584, 28),
])
def test_wave_quantization_by_hand(B, F, tiles, waves):
    w = ci.wave_quantization(B, F, H100)
    assert (w.tiles, w.waves, w.sms) == (tiles, waves, 132)
    assert w.efficiency == pytest.approx(tiles / (waves * 132))


def test_wave_quantization_counts_the_padding_inside_the_tiles():
    """B = 64 fills half of each 128-row tile: 112 tiles in one wave use 112/132 of the
    slots, but only 64 x 28,672 / (132 x 128 x 256) = 42% of the SM time is real output."""
    w = ci.wave_quantization(64, 28672, H100)
    assert w.efficiency == pytest.approx(112 / 132)
    assert w.useful == pytest.approx(64 * 28672 / (132 * 128 * 256))
    assert round(w.useful, 2) == 0.42
    full = ci.wave_quantization(4096, 28672, H100)       # whole tiles: only the waves count
    assert full.useful == pytest.approx(full.efficiency)
    with pytest.raises(ValueError, match="wave_quantization"):
        ci.Waves(112, 132, 1).useful


def test_wave_quantization_errors():
    with pytest.raises(ValueError, match="tile"):
        ci.wave_quantization(128, 128, H100, tile=128)
    with pytest.raises(ValueError, match="sm_count"):
        ci.wave_quantization(128, 128, "tpu-v5e")


def test_fat_trees_and_scalable_units():
    assert topology.fat_tree_endpoints(64, 1) == 64
    assert topology.fat_tree_endpoints(64, 2) == 64 * 64 // 2
    assert topology.fat_tree_endpoints(64, 3) == 64 ** 3 // 4
    with pytest.raises(ValueError, match="even"):
        topology.fat_tree_endpoints(63, 2)
    su = topology.scalable_unit()
    assert (su.nodes, su.gpus_per_node, su.leaf_switches, su.gpus) == (32, 8, 8, 256)
    assert su.ports_up == su.nodes                      # non-blocking: as many up as down


def test_hierarchical_dp_critical_batch_by_hand():
    # pipelined: max(2 (7/8) s / W_nvl, 2 (m-1)/m (s/8) / W_nic) x C / 4
    s, C = 2, 989e12
    for m in (1, 2, 64):
        t = max(2 * 7 / 8 * s / 450e9, 2 * (m - 1) / m * s / 8 / 50e9)
        assert par.hierarchical_dp_critical_batch(H100, m) == pytest.approx(C * t / 4)
    # one node: chapter 5's figure inside a node of 8
    assert par.hierarchical_dp_critical_batch(H100, 1) == pytest.approx(
        par.data_parallel_critical_batch(H100, n=8))
    seq = par.hierarchical_dp_critical_batch(H100, 4, pipelined=False)
    assert seq == pytest.approx(C * (2 * 7 / 8 * s / 450e9 + 2 * 3 / 4 * s / 8 / 50e9) / 4)
    with pytest.raises(ValueError, match="not a GPU"):
        par.hierarchical_dp_critical_batch("tpu-v5p", 4)


def test_ep_critical_width_by_hand():
    C, s = 989e12, 2
    assert par.ep_critical_width(H100, 8) == pytest.approx(C * 7 / 8 * s / 450e9 / 2)
    t = 7 / 32 / 450e9 + 24 / 32 / 50e9
    assert par.ep_critical_width(H100, 32) == pytest.approx(C * s * t / 2)
    with pytest.raises(ValueError, match="whole nodes"):
        par.ep_critical_width(H100, 12)
    # a gated expert (gate, up, down: 6 D F FLOPs per routed copy): F* = C s t / 3, the
    # figure the review of chapter 11 worked by hand for 64 H100s in 8 nodes (11,699)
    t64 = 7 / 64 / 450e9 + 56 / 64 / 50e9
    assert par.ep_critical_width(H100, 64, matmuls=3) == pytest.approx(C * s * t64 / 3)
    assert round(par.ep_critical_width(H100, 64, matmuls=3)) == 11699
    assert par.ep_critical_width(H100, 8, matmuls=3) == pytest.approx(
        2 / 3 * par.ep_critical_width(H100, 8))
    with pytest.raises(ValueError, match="matmuls"):
        par.ep_critical_width(H100, 8, matmuls=0)
    gb = hardware.preview_chip("gpu-gb200")          # 64 GPUs inside one NVL72 domain
    assert par.ep_critical_width(gb, 64) == pytest.approx(
        gb.bf16_flops * 63 / 64 * s / gb.ici_bandwidth / 2)
    # a TPU: collective_time's all-to-all along one torus axis
    assert par.ep_critical_width("tpu-v5p", 8) == pytest.approx(
        hardware.get_chip("tpu-v5p").bf16_flops
        * coll.collective_time("all-to-all", s, 8, "tpu-v5p") / 2)


def test_no_gpu_measurements_are_stored_from_a_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(measure, "GPU_MEASUREMENTS_DIR", tmp_path)
    assert measure.stored_gpu_measurements() == []
    (tmp_path / "cpu-x1.json").write_text(json.dumps({"platform": "cpu"}))
    (tmp_path / "nvidia-h100-x8.json").write_text(json.dumps({"platform": "gpu",
                                                              "device_kind": "H100"}))
    assert [r["device_kind"] for r in measure.stored_gpu_measurements()] == ["H100"]


def test_gpu_measure_script_refuses_a_cpu_and_tests_itself(tmp_path):
    env_py = [sys.executable, str(ROOT / "tools" / "gpu_measure.py")]
    r = subprocess.run(env_py + ["--small", "--out", str(tmp_path)], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0 and "no GPU here" in (r.stderr + r.stdout)
    r = subprocess.run(env_py + ["--small", "--allow-cpu", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["platform"] == "cpu" and record["chip"] is None
    assert [row["n"] for row in record["matmul"]] == [64, 128]
    assert math.isfinite(record["copy_bandwidth"])
