"""Every chip figure pinned as a literal, written the way its source states it.

If a figure in scalebook.hardware changes (a typo, two chips' values swapped, a unit slip),
this test fails and names it: change it here too only when the cited source says so. Units:
FLOP/s, bytes, bytes/s (one direction, per link for ICI/NVLink), dollars per chip-hour.
"""

import dataclasses

import pytest

from scalebook import hardware

GiB = 2**30
T, G = 1e12, 1e9

PINNED = {
    "tpu-v4": dict(bf16_flops=275 * T, int8_flops=275 * T, fp8_flops=None, hbm_bytes=32 * GiB,
                   hbm_bandwidth=1200 * G, ici_link_bandwidth=45 * G, ici_links=6,
                   dcn_bandwidth=None, pcie_bandwidth=15 * G, price_per_hour=None, tensorcores=2,
                   mxus_per_core=4, mxu_size=128, vmem_bytes=None, chips_per_host=4,
                   ici_domain_chips=4096,
                   max_slice_chips=None, vector_flops=None, vmem_bandwidth=None),
    "tpu-v5e": dict(bf16_flops=197 * T, int8_flops=394 * T, fp8_flops=None, hbm_bytes=16 * G,
                    hbm_bandwidth=819 * G, ici_link_bandwidth=50 * G, ici_links=4,
                    dcn_bandwidth=3.125 * G, pcie_bandwidth=15 * G, price_per_hour=1.2,
                    tensorcores=1, mxus_per_core=4, mxu_size=128, vmem_bytes=128 * 2**20,
                    chips_per_host=8, ici_domain_chips=256,
                    max_slice_chips=256, vector_flops=None, vmem_bandwidth=22 * 819 * G),
    "tpu-v5p": dict(bf16_flops=459 * T, int8_flops=918 * T, fp8_flops=None, hbm_bytes=95 * GiB,
                    hbm_bandwidth=2765 * G, ici_link_bandwidth=100 * G, ici_links=6,
                    dcn_bandwidth=6.25 * G, pcie_bandwidth=15 * G, price_per_hour=4.2,
                    tensorcores=2, mxus_per_core=4, mxu_size=128, vmem_bytes=None,
                    chips_per_host=4, ici_domain_chips=8960,
                    max_slice_chips=6144, vector_flops=8 * 128 * 4 * 1.75 * G * 2,
                    vmem_bandwidth=None),
    "tpu-v6e": dict(bf16_flops=918 * T, int8_flops=1836 * T, fp8_flops=None, hbm_bytes=32 * G,
                    hbm_bandwidth=1638 * G, ici_link_bandwidth=100 * G, ici_links=4,
                    dcn_bandwidth=None, pcie_bandwidth=32 * G, price_per_hour=None,
                    tensorcores=1, mxus_per_core=4, mxu_size=256, vmem_bytes=None,
                    chips_per_host=8, ici_domain_chips=256,
                    max_slice_chips=256, vector_flops=None, vmem_bandwidth=None),
    "gpu-a100": dict(bf16_flops=312 * T, int8_flops=624 * T, fp8_flops=None, hbm_bytes=80 * G,
                     hbm_bandwidth=2039 * G, ici_link_bandwidth=25 * G, ici_links=12,
                     dcn_bandwidth=25 * G, pcie_bandwidth=32 * G, price_per_hour=None,
                     tensorcores=None, mxus_per_core=None, mxu_size=None, vmem_bytes=None,
                     chips_per_host=8, ici_domain_chips=8,
                     max_slice_chips=8, vector_flops=19.5 * T,
                     vmem_bandwidth=None),
    "gpu-h100": dict(bf16_flops=989 * T, int8_flops=None, fp8_flops=1979 * T, hbm_bytes=80 * G,
                     hbm_bandwidth=3350 * G, ici_link_bandwidth=25 * G, ici_links=18,
                     dcn_bandwidth=50 * G, pcie_bandwidth=64 * G, price_per_hour=10.8,
                     tensorcores=None, mxus_per_core=None, mxu_size=None, vmem_bytes=None,
                     chips_per_host=8, ici_domain_chips=8,
                     max_slice_chips=8, vector_flops=67 * T,
                     vmem_bandwidth=None),
    "gpu-h200": dict(bf16_flops=989 * T, int8_flops=None, fp8_flops=1979 * T, hbm_bytes=141 * G,
                     hbm_bandwidth=4800 * G, ici_link_bandwidth=25 * G, ici_links=18,
                     dcn_bandwidth=50 * G, pcie_bandwidth=64 * G, price_per_hour=None,
                     tensorcores=None, mxus_per_core=None, mxu_size=None, vmem_bytes=None,
                     chips_per_host=8, ici_domain_chips=8,
                     max_slice_chips=8, vector_flops=67 * T,
                     vmem_bandwidth=None),
    "gpu-b200": dict(bf16_flops=2250 * T, int8_flops=None, fp8_flops=4500 * T, hbm_bytes=180 * G,
                     hbm_bandwidth=8000 * G, ici_link_bandwidth=50 * G, ici_links=18,
                     dcn_bandwidth=50 * G, pcie_bandwidth=64 * G, price_per_hour=None,
                     tensorcores=None, mxus_per_core=None, mxu_size=None, vmem_bytes=None,
                     chips_per_host=8, ici_domain_chips=8,
                     max_slice_chips=8, vector_flops=75 * T,
                     vmem_bandwidth=None),
}

# The inside of the GPUs (chapter 11), as NVIDIA's whitepapers and CUDA's guide state them
# (on-chip memories in binary units); None on every TPU, and where NVIDIA states nothing.
KiB, MiB = 2**10, 2**20
_HOPPER = dict(sm_count=132, tensor_cores_per_sm=4, cuda_cores_per_sm=128,
               tensor_flops_per_sm_clock=4096, tensor_clock=1.83 * G, boost_clock=1.98 * G,
               register_bytes_per_sm=256 * KiB, l1_bytes_per_sm=256 * KiB,
               smem_bytes_per_sm=228 * KiB, l2_bytes=50 * MiB)
GPU_INSIDE = {
    "gpu-a100": dict(sm_count=108, tensor_cores_per_sm=4, cuda_cores_per_sm=64,
                     tensor_flops_per_sm_clock=2048, tensor_clock=1.41 * G,
                     boost_clock=1.41 * G, register_bytes_per_sm=256 * KiB,
                     l1_bytes_per_sm=192 * KiB, smem_bytes_per_sm=164 * KiB,
                     l2_bytes=40 * MiB),
    "gpu-h100": _HOPPER,
    "gpu-h200": _HOPPER,
    "gpu-b200": dict(sm_count=148, tensor_cores_per_sm=4, cuda_cores_per_sm=128,
                     tensor_flops_per_sm_clock=None, tensor_clock=None, boost_clock=None,
                     register_bytes_per_sm=256 * KiB, l1_bytes_per_sm=None,
                     smem_bytes_per_sm=228 * KiB, l2_bytes=None),
}
for _name, _figures in PINNED.items():
    _figures.update(GPU_INSIDE.get(_name, dict.fromkeys(hardware.GPU_FIELDS)))

NUMERIC = [f.name for f in dataclasses.fields(hardware.Chip)
           if f.name not in ("name", "vendor", "display_name", "topology", "notes", "sources",
                             "hbm_unit")]


def test_the_pinned_table_covers_every_chip_and_figure():
    assert set(PINNED) == set(hardware.chip_names())
    for name, figures in PINNED.items():
        assert set(figures) == set(NUMERIC), name


@pytest.mark.parametrize("name,figure", [(n, f) for n in PINNED for f in NUMERIC])
def test_figure_equals_its_pinned_value(name, figure):
    got, want = getattr(hardware.get_chip(name), figure), PINNED[name][figure]
    if want is None:
        assert got is None
    else:
        assert got == pytest.approx(want, rel=1e-12), f"{name}.{figure}: {got} vs pinned {want}"


@pytest.mark.parametrize("name,figure", [(n, f) for n in PINNED for f in NUMERIC
                                         if PINNED[n][f] is not None])
def test_every_published_figure_has_a_source(name, figure):
    chip = hardware.get_chip(name)
    if figure in ("ici_links", "tensorcores", "mxus_per_core", "chips_per_host"):
        return   # counts stated in the same source as the figure next to them
    assert chip.source(figure)


@pytest.mark.parametrize("name,attribute,theirs,why", hardware.SCALING_BOOK_DIFFERENCES,
                         ids=lambda v: v if isinstance(v, str) and len(v) < 20 else "")
def test_each_listed_difference_from_the_scaling_book_is_real(name, attribute, theirs, why):
    # The hardware page shows these side by side: a row whose figures agree is not a difference.
    ours = getattr(hardware.get_chip(name), attribute)
    assert ours != pytest.approx(theirs, rel=1e-3), (name, attribute)
    assert len(why) > 20, "say why ours is chosen"


@pytest.mark.parametrize("name,attribute,factors,how,confidence", hardware.DERIVED_FIGURES,
                         ids=lambda v: v if isinstance(v, str) and len(v) < 20 else "")
def test_each_derived_figure_is_the_product_of_its_stated_factors(name, attribute, factors,
                                                                  how, confidence):
    import math
    chip = hardware.get_chip(name)
    assert getattr(chip, attribute) == pytest.approx(math.prod(factors.values()), rel=1e-12)
    assert chip.source(attribute)                      # the description it is derived from
    assert len(how) > 20 and confidence.split(":")[0] in ("high", "medium", "low")


def test_the_tpu7x_preview_is_pinned_and_kept_out_of_the_main_table():
    c = hardware.preview_chip("tpu7x")
    assert "tpu7x" not in hardware.chip_names()
    want = dict(bf16_flops=2307 * T, fp8_flops=4614 * T, hbm_bytes=192 * GiB,
                hbm_bandwidth=7380 * G, ici_link_bandwidth=1200 * G / 6 / 2, ici_links=6,
                dcn_bandwidth=12.5 * G, tensorcores=2, chips_per_host=4, ici_domain_chips=9216)
    for figure, value in want.items():
        assert getattr(c, figure) == pytest.approx(value, rel=1e-12), figure
        assert c.source(figure)
        assert hardware.PREVIEW_CONFIDENCE["tpu7x"][figure].split(":")[0] in (
            "high", "medium", "low")
    with pytest.raises(KeyError, match="preview chips: tpu7x"):
        hardware.preview_chip("tpu8")
