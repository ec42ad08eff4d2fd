"""scalebook.hardware: the chip table, its sources and its error messages."""

import dataclasses
import math

import pytest

from scalebook import hardware
from scalebook.errors import UnknownNameError

REQUIRED = ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200"]
NUMERIC = [f.name for f in dataclasses.fields(hardware.Chip) if str(f.type).split(" ")[0] in ("float", "int")]


def test_every_required_chip_is_there():
    assert set(REQUIRED) <= set(hardware.chip_names())
    for name in REQUIRED:
        chip = hardware.get_chip(name)
        assert chip.name == name
        for attr in ("bf16_flops", "hbm_bytes", "hbm_bandwidth", "critical_intensity"):
            assert getattr(chip, attr) > 0


def test_unknown_chip_lists_the_known_ones():
    with pytest.raises(UnknownNameError) as e:
        hardware.get_chip("tpu-v9")
    message = str(e.value)
    assert "tpu-v9" in message
    for name in REQUIRED:
        assert name in message
    assert isinstance(e.value, KeyError)      # callers may catch KeyError


@pytest.mark.parametrize("alias,name", [("TPU v5e", "tpu-v5e"), ("v5p", "tpu-v5p"), ("H100", "gpu-h100"),
                                        ("gpu_b200", "gpu-b200")])
def test_forgiving_spellings(alias, name):
    assert hardware.get_chip(alias).name == name


@pytest.mark.parametrize("bad", [None, 5, 1.5, ["tpu-v5e"]])
def test_non_string_names_are_rejected(bad):
    with pytest.raises(TypeError, match="chip must be a name"):
        hardware.get_chip(bad)


def test_every_published_figure_has_a_source():
    for chip in hardware.all_chips():
        for f in NUMERIC:
            value = getattr(chip, f)
            if value is not None:
                assert f in chip.sources, f"{chip.name}.{f} = {value} has no source"
        for attr, key in chip.sources.items():
            assert key in hardware.SOURCES, f"{chip.name}.{attr} cites unknown source {key!r}"
            assert chip.source(attr).startswith(hardware.SOURCES[key][:20])


def test_missing_source_is_a_clear_error():
    chip = hardware.get_chip("tpu-v6e")
    with pytest.raises(KeyError, match="no source recorded"):
        chip.source("price_per_hour")


def test_critical_intensity_is_peak_over_bandwidth():
    for chip in hardware.all_chips():
        assert math.isclose(chip.critical_intensity, chip.bf16_flops / chip.hbm_bandwidth)
        assert math.isclose(chip.ici_bandwidth, chip.ici_links * chip.ici_link_bandwidth)


def test_units_are_plausible():
    """Catch a figure typed in the wrong unit (GB/s for bytes/s, TFLOP/s for FLOP/s)."""
    for chip in hardware.all_chips():
        assert 1e14 <= chip.bf16_flops <= 1e16, chip.name
        assert 1e10 <= chip.hbm_bytes <= 1e12, chip.name
        assert 1e11 <= chip.hbm_bandwidth <= 1e13, chip.name
        assert 1e9 <= chip.ici_link_bandwidth <= 1e12, chip.name
        assert 50 <= chip.critical_intensity <= 1000, chip.name
        for f in ("int8_flops", "fp8_flops"):
            v = getattr(chip, f)
            assert v is None or v >= chip.bf16_flops


def test_gib_only_where_the_vendor_says_gib():
    for chip in hardware.all_chips():
        if chip.hbm_unit == "GiB":
            assert chip.hbm_bytes % 2**30 == 0
        else:
            assert chip.hbm_unit == "GB" and chip.hbm_bytes % 1e9 == 0


def test_peak_flops_by_dtype():
    h100 = hardware.get_chip("gpu-h100")
    assert h100.peak_flops("fp8") == h100.fp8_flops
    assert h100.critical_intensity_for("fp8") == h100.fp8_flops / h100.hbm_bandwidth
    with pytest.raises(ValueError, match="no published int8"):
        h100.peak_flops("int8")
    with pytest.raises(ValueError, match="dtype must be one of"):
        h100.peak_flops("fp64")


def test_spec_table_rejects_unknown_columns():
    rows = hardware.spec_table(["tpu-v5e"], ["bf16_flops", "critical_intensity"])
    assert rows == [{"chip": "tpu-v5e", "bf16_flops": hardware.get_chip("tpu-v5e").bf16_flops,
                     "critical_intensity": hardware.get_chip("tpu-v5e").critical_intensity}]
    with pytest.raises(ValueError, match="unknown column"):
        hardware.spec_table(columns=["hbm_gb"])


def test_with_makes_a_modified_copy_that_every_function_accepts():
    from scalebook import collectives, roofline
    v5p = hardware.get_chip("tpu-v5p")
    fast = v5p.with_(ici_link_bandwidth=2 * v5p.ici_link_bandwidth)
    assert fast.name == "tpu-v5p (modified)" and v5p.name == "tpu-v5p"
    assert fast.ici_link_bandwidth == 2 * v5p.ici_link_bandwidth
    assert fast.bf16_flops == v5p.bf16_flops and fast.source("bf16_flops") == v5p.source("bf16_flops")
    with pytest.raises(KeyError):
        fast.source("ici_link_bandwidth")          # the reader's figure has no vendor source
    t = collectives.collective_time("all-gather", 1e9, 8, v5p)
    assert collectives.collective_time("all-gather", 1e9, 8, fast) == pytest.approx(t / 2)
    assert hardware.get_chip(fast) is fast
    assert roofline.critical_batch(8192, 8192, fast.with_(hbm_bandwidth=v5p.hbm_bandwidth / 2)) > \
        roofline.critical_batch(8192, 8192, v5p)


def test_with_refuses_unknown_figures_and_bad_values():
    v5e = hardware.get_chip("tpu-v5e")
    with pytest.raises(TypeError, match="no figure 'hbm_bw'"):
        v5e.with_(hbm_bw=1e12)
    with pytest.raises(ValueError, match="positive"):
        v5e.with_(hbm_bandwidth=-1)
    with pytest.raises(ValueError, match="positive"):
        v5e.with_(bf16_flops="fast")
