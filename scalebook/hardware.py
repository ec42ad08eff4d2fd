"""Accelerator specifications: one table, one source per figure.

Every hardware number the book prints comes from this module. Units:

* ``bf16_flops``, ``int8_flops``, ``fp8_flops``: dense peak, FLOP/s (or OP/s for int8)
  per chip. NVIDIA quotes its headline tensor numbers "with sparsity"; the figures here
  are the dense ones (half of those).
* ``hbm_bytes``: HBM capacity per chip in bytes. Given in GiB (2**30) only where the
  vendor states GiB.
* ``hbm_bandwidth``: bytes/s per chip.
* ``ici_link_bandwidth``: bytes/s *in one direction* over one chip-to-chip link
  (ICI on TPUs, NVLink on GPUs); ``ici_links``: links per chip.
* ``dcn_bandwidth``: data-centre network bytes/s per chip, one direction.
* ``pcie_bandwidth``: host <-> chip bytes/s, one direction.
* ``price_per_hour``: on-demand US dollars per chip-hour where a published price was
  found; ``None`` otherwise.

Inside the chip and around it (``None`` where the vendor publishes no figure; GPUs have
no MXU, so their MXU fields are ``None``):

* ``tensorcores``: TensorCores per TPU chip; ``mxus_per_core``: matrix units (MXUs) per
  TensorCore; ``mxu_size``: side of one MXU's square systolic array (128 means 128 x 128
  multiply-add cells).
* ``vmem_bytes``: on-chip vector memory (VMEM) per TensorCore, bytes.
* ``vmem_bandwidth``: bytes/s between VMEM and the MXUs of the chip. Google publishes no
  figure; the one stored (v5e) is derived from a stated ratio to HBM, see
  :data:`DERIVED_FIGURES`.
* ``chips_per_host``: chips attached over PCIe to one host CPU (a TPU host, or one 8-GPU
  HGX/DGX server).
* ``ici_domain_chips``: the most chips one fast chip-to-chip network joins: a full TPU pod
  (ICI), or for GPUs the NVSwitch domain of one HGX/DGX server (NVLink).
* ``max_slice_chips``: the largest slice one job can be given on that network. It equals
  the pod where the vendor says so (v5e, v6e, the GPU servers); a v5p pod has 8,960 chips
  but its largest slice has 6,144, so a plan for one ICI domain uses this figure, and more
  chips than this are joined by the data-centre network (multislice). ``None`` where the
  vendor states no limit (v4).
* ``vector_flops``: peak f32 FLOP/s of the units that are not matrix units: the VPU of a
  TPU, the CUDA cores (non-tensor FP32) of a GPU. NVIDIA publishes it; Google does not, so
  a TPU figure is derived (see :data:`DERIVED_FIGURES`, which says how and how sure) or
  ``None``.

Inside an NVIDIA GPU (chapter 11; ``None`` on TPUs, and on a GPU where NVIDIA publishes
no figure):

* ``sm_count``: streaming multiprocessors (SMs) per GPU; ``tensor_cores_per_sm`` and
  ``cuda_cores_per_sm``: the Tensor Cores and FP32 CUDA cores of one SM (an SM has four
  sub-partitions, each with one warp scheduler, one Tensor Core and a quarter of the CUDA
  cores and registers).
* ``tensor_flops_per_sm_clock``: dense bf16 FLOPs one SM's Tensor Cores do per clock.
* ``tensor_clock``: the clock (Hz) at which NVIDIA states the dense tensor peak;
  ``boost_clock``: the highest SM clock, at which it states the FP32 ``vector_flops``. On
  an H100 SXM the two differ (1.83 and 1.98 GHz): the tensor peak assumes the clock the
  GPU holds within its power limit while its Tensor Cores are busy.
* ``register_bytes_per_sm``, ``l1_bytes_per_sm`` (L1 data cache and shared memory
  together), ``smem_bytes_per_sm`` (the most of it a kernel may use as shared memory),
  ``l2_bytes`` (per GPU). On-chip memories are sized in powers of two and counted so here:
  NVIDIA's "228 KB" of shared memory is 228 x 1024 bytes, as the device itself reports.

So ``sm_count x tensor_flops_per_sm_clock x tensor_clock`` is the bf16 peak and
``sm_count x cuda_cores_per_sm x 2 x boost_clock`` the FP32 vector peak (a fused
multiply-add is two FLOPs); tests/test_hardware_gpu.py checks both products against the
datasheet figures.

Use :func:`get_chip` with a canonical name ("tpu-v5e", "gpu-h100", ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .errors import UnknownNameError
from .units import GiB, KiB, MiB

__all__ = ["Chip", "get_chip", "chip_names", "all_chips", "SOURCES", "spec_table",
           "SCALING_BOOK_DIFFERENCES", "DERIVED_FIGURES", "preview_chip",
           "PREVIEW_CONFIDENCE", "GPU_FIELDS", "DEVICE_REPORTED_HBM"]

# Short keys for the sources cited below; the full references are in book/references.md.
SOURCES = {
    "cloud-v4": "Google Cloud TPU docs, TPU v4, https://cloud.google.com/tpu/docs/v4",
    "cloud-v5e": "Google Cloud TPU docs, TPU v5e, https://cloud.google.com/tpu/docs/v5e",
    "cloud-v5p": "Google Cloud TPU docs, TPU v5p, https://cloud.google.com/tpu/docs/v5p",
    "cloud-v6e": "Google Cloud TPU docs, TPU v6e, https://cloud.google.com/tpu/docs/v6e",
    "scaling-book": "Austin et al., How to Scale Your Model, chapter on TPUs, "
                    "https://jax-ml.github.io/scaling-book/tpus/",
    "scaling-book-gpus": "Austin et al., How to Scale Your Model, chapter on GPUs, "
                         "https://jax-ml.github.io/scaling-book/gpus/",
    "scaling-book-pricing": "Austin et al., How to Scale Your Model, applied inference chapter "
                            "(Google Cloud on-demand prices, Feb 2025), "
                            "https://jax-ml.github.io/scaling-book/applied-inference/",
    "nv-a100": "NVIDIA A100 datasheet, https://www.nvidia.com/en-us/data-center/a100/",
    "nv-dgx-a100": "NVIDIA DGX A100, https://www.nvidia.com/en-us/data-center/dgx-a100/",
    "nv-h100": "NVIDIA H100, https://www.nvidia.com/en-us/data-center/h100/",
    "nv-dgx-h100": "NVIDIA DGX H100, https://www.nvidia.com/en-us/data-center/dgx-h100/",
    "nv-h200": "NVIDIA H200, https://www.nvidia.com/en-us/data-center/h200/ and the MLCommons "
               "Inference v4.1 system description H200-SXM-141GBx8",
    "nv-hgx": "NVIDIA HGX B200, https://www.nvidia.com/en-us/data-center/hgx/",
    "nv-dgx-b200": "NVIDIA DGX B200, https://www.nvidia.com/en-us/data-center/dgx-b200/",
    "cloud-v5p-slices": "Google Cloud TPU docs, TPU v5p configurations (table of slice "
                        "topologies with chips and hosts), https://cloud.google.com/tpu/docs/v5p",
    "scaling-book-vpu": "Austin et al., How to Scale Your Model, TPU chapter, appendix on the "
                        "VPU (8 x 128 lanes, 4 f32 ALUs each on v5), "
                        "https://jax-ml.github.io/scaling-book/tpus/",
    "google-trillium": "Google Cloud blog, Introducing Trillium (2024): 4.7x v5e's peak from "
                       "larger MXUs and a faster clock; the MXU count of 4 is derived from the "
                       "peak at v5p's clock (Google's v6e page says 2; see the chip's notes), "
                       "https://cloud.google.com/blog/products/compute/"
                       "introducing-trillium-6th-gen-tpus",
    "cloud-tpu7x": "Google Cloud TPU docs, TPU7x (Ironwood), specification table, "
                   "https://docs.cloud.google.com/tpu/docs/tpu7x",
    "press-ironwood": "The Register on TPU7x (Ironwood), Nov 2025: four ICI links, 9.6 Tbps "
                      "aggregate bidirectional per chip, https://www.theregister.com/",
    "nv-dgx-basepod": "NVIDIA DGX BasePOD reference architecture, core components (DGX H200: "
                      "eight single-port ConnectX-7, up to 400 Gb/s each), "
                      "https://docs.nvidia.com/dgx-basepod/",
    "mlperf-h200": "MLCommons Inference v4.1, NVIDIA system description H200-SXM-141GBx8 "
                   "(accelerator host interconnect: PCIe Gen5 x16)",
    "nv-ampere-whitepaper": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 "
                            "SMs, 64 FP32 CUDA cores and 4 Tensor Cores per SM, 1,024 dense "
                            "FP16 FMA per SM per clock, 1,410 MHz boost, 192 KB L1/shared "
                            "per SM (up to 164 KB shared), 256 KB registers per SM, 40 MB L2, "
                            "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/"
                            "nvidia-ampere-architecture-whitepaper.pdf",
    "nv-hopper-whitepaper": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), "
                            "table 3 (H100 SXM5: 132 SMs, 128 FP32 CUDA cores and 4 Tensor "
                            "Cores per SM, twice the A100 SM's dense tensor rate per clock, "
                            "256 KB L1/shared and 256 KB registers per SM, 50 MB L2; tensor "
                            "peaks at 1.83 GHz, FP32/FP64 at 1.98 GHz, as summarised at "
                            "https://glennklockwood.com/garden/processors/h100), "
                            "https://resources.nvidia.com/en-us-tensor-core",
    "nv-forum-tc-rate": "NVIDIA developer forum, 'How to calculate the Tensor Core FP16 "
                        "performance of H100' (2023): 2,048 dense FP16 FLOPs per SM per clock "
                        "on the A100 (1,024 FMA), 4,096 on Hopper, checked against the peaks, "
                        "https://forums.developer.nvidia.com/t/"
                        "how-to-calculate-the-tensor-core-fp16-performance-of-h100/244727",
    "cuda-guide-cc": "NVIDIA CUDA C++ Programming Guide, technical specifications per compute "
                     "capability: 64K 32-bit registers per SM; at most 164 KB (8.0), 228 KB "
                     "(9.0, 10.0) of shared memory per SM, "
                     "https://docs.nvidia.com/cuda/cuda-c-programming-guide/",
    "nv-h200-gh100": "NVIDIA H200 page (the H100 SXM's FP8 and BF16 peaks) with the H100 "
                     "whitepaper's SXM5 configuration: the H200 is the same GH100 part with "
                     "HBM3e; scaling-book's GPU table lists 132 SMs and 50 MB of L2 for both",
    "nvidia-smi-h100": "nvidia-smi on an H100 80GB HBM3 (SXM) reports 81,559 MiB of total "
                       "memory, as printed in many public logs",
    "nv-gb200-nvl72": "NVIDIA GB200 NVL72, https://www.nvidia.com/en-us/data-center/gb200-nvl72/"
                      " (72 GPUs in one NVLink domain, 130 TB/s of NVLink per rack, 186 GB of "
                      "HBM3e per GPU, 8 TB/s, 360 PFLOPS of sparse BF16 per rack)",
    "deepseekv3": "DeepSeek-AI, DeepSeek-V3 Technical Report (2024), section 3.2.2, "
                  "https://arxiv.org/abs/2412.19437",
}

#: The fields of :class:`Chip` that describe the inside of an NVIDIA GPU (chapter 11).
GPU_FIELDS = ("sm_count", "tensor_cores_per_sm", "cuda_cores_per_sm",
              "tensor_flops_per_sm_clock", "tensor_clock", "boost_clock",
              "register_bytes_per_sm", "l1_bytes_per_sm", "smem_bytes_per_sm", "l2_bytes")


@dataclass(frozen=True)
class Chip:
    """One accelerator chip. All rates per chip, in bytes/s or FLOP/s."""

    name: str
    vendor: str
    display_name: str
    bf16_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    ici_link_bandwidth: float
    ici_links: int
    topology: str
    int8_flops: float | None = None
    fp8_flops: float | None = None
    dcn_bandwidth: float | None = None
    pcie_bandwidth: float | None = None
    price_per_hour: float | None = None
    tensorcores: int | None = None
    mxus_per_core: int | None = None
    mxu_size: int | None = None
    vmem_bytes: float | None = None
    chips_per_host: int | None = None
    ici_domain_chips: int | None = None
    max_slice_chips: int | None = None
    vector_flops: float | None = None
    vmem_bandwidth: float | None = None
    sm_count: int | None = None
    tensor_cores_per_sm: int | None = None
    cuda_cores_per_sm: int | None = None
    tensor_flops_per_sm_clock: int | None = None
    tensor_clock: float | None = None
    boost_clock: float | None = None
    register_bytes_per_sm: float | None = None
    l1_bytes_per_sm: float | None = None
    smem_bytes_per_sm: float | None = None
    l2_bytes: float | None = None
    hbm_unit: str = "GB"
    notes: str = ""
    sources: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- derived quantities -------------------------------------------------------
    @property
    def critical_intensity(self) -> float:
        """bf16 FLOPs per HBM byte at which compute time equals memory time."""
        return self.bf16_flops / self.hbm_bandwidth

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Peak dense FLOP/s for ``dtype`` in {"bf16", "fp8", "int8"}; error if unpublished."""
        key = {"bf16": "bf16_flops", "bfloat16": "bf16_flops", "fp8": "fp8_flops",
               "int8": "int8_flops"}.get(str(dtype).lower())
        if key is None:
            raise ValueError(f"dtype must be one of 'bf16', 'fp8', 'int8'; got {dtype!r}")
        value = getattr(self, key)
        if value is None:
            raise ValueError(f"{self.name} has no published {dtype} peak in scalebook.hardware")
        return value

    def critical_intensity_for(self, dtype: str = "bf16") -> float:
        """FLOPs per HBM byte at which a ``dtype`` computation turns compute-bound."""
        return self.peak_flops(dtype) / self.hbm_bandwidth

    @property
    def ici_bandwidth(self) -> float:
        """Total one-way chip-to-chip bandwidth of the chip: links x per-link bandwidth."""
        return self.ici_links * self.ici_link_bandwidth

    def with_(self, **changes) -> "Chip":
        """A copy of this chip with some figures replaced, e.g.
        ``get_chip("tpu-v5p").with_(ici_link_bandwidth=9e10)`` for "what if the link were
        faster?". The copy is named ``"<name> (modified)"``; a changed figure loses its
        source (it is the reader's, not the vendor's). Unknown fields are refused by name."""
        fields = {f.name for f in dataclasses.fields(Chip)} - {"sources"}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise TypeError(f"Chip has no figure {', '.join(map(repr, unknown))}; figures: "
                            f"{', '.join(sorted(fields - {'name', 'vendor', 'notes'}))}")
        numeric = {f.name for f in dataclasses.fields(Chip)
                   if f.type in ("float", "int", "float | None", "int | None")}
        for key, value in changes.items():
            if key in numeric and value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise ValueError(f"{key} must be a positive number; got {value!r}")
        sources = {k: v for k, v in self.sources.items() if k not in changes}
        name = changes.pop("name", self.name if self.name.endswith("(modified)")
                           else f"{self.name} (modified)")
        display = changes.pop("display_name", self.display_name if "(modified)" in self.display_name
                              else f"{self.display_name} (modified)")
        return dataclasses.replace(self, name=name, display_name=display, sources=sources, **changes)

    def source(self, attribute: str) -> str:
        """The citation for one figure, e.g. ``chip.source("hbm_bandwidth")``."""
        if attribute not in self.sources:
            raise KeyError(f"no source recorded for {self.name}.{attribute}")
        return SOURCES[self.sources[attribute]]


def _chip(**kw) -> Chip:
    return Chip(**kw)


_CHIPS: dict[str, Chip] = {}


def _add(chip: Chip) -> None:
    _CHIPS[chip.name] = chip


_add(_chip(
    name="tpu-v4", vendor="Google", display_name="TPU v4",
    bf16_flops=2.75e14, int8_flops=2.75e14,
    hbm_bytes=32 * GiB, hbm_unit="GiB", hbm_bandwidth=1.2e12,
    ici_link_bandwidth=4.5e10, ici_links=6, topology="3D torus",
    dcn_bandwidth=None, pcie_bandwidth=1.5e10, price_per_hour=None,
    tensorcores=2, mxus_per_core=4, mxu_size=128, vmem_bytes=None, chips_per_host=4,
    ici_domain_chips=4096, max_slice_chips=None, vector_flops=None,
    sources=dict(bf16_flops="cloud-v4", int8_flops="cloud-v4", hbm_bytes="cloud-v4",
                 hbm_bandwidth="cloud-v4", ici_link_bandwidth="scaling-book",
                 ici_links="scaling-book", topology="cloud-v4", pcie_bandwidth="scaling-book",
                 tensorcores="cloud-v4", mxus_per_core="cloud-v4", mxu_size="scaling-book",
                 chips_per_host="scaling-book", ici_domain_chips="cloud-v4"),
))
_add(_chip(
    name="tpu-v5e", vendor="Google", display_name="TPU v5e",
    bf16_flops=1.97e14, int8_flops=3.94e14,
    hbm_bytes=16e9, hbm_bandwidth=8.19e11,
    # 400 GB/s bidirectional per chip over 4 ports -> 50 GB/s per link per direction.
    ici_link_bandwidth=5e10, ici_links=4, topology="2D torus",
    # 6.4 Tbps of DCN per 256-chip pod -> 25 Gbps = 3.125e9 bytes/s per chip.
    dcn_bandwidth=3.125e9, pcie_bandwidth=1.5e10, price_per_hour=1.20,
    tensorcores=1, mxus_per_core=4, mxu_size=128, vmem_bytes=128 * MiB, chips_per_host=8,
    ici_domain_chips=256, max_slice_chips=256, vector_flops=None,
    vmem_bandwidth=22 * 8.19e11,
    sources=dict(bf16_flops="cloud-v5e", int8_flops="cloud-v5e", hbm_bytes="cloud-v5e",
                 hbm_bandwidth="cloud-v5e", ici_link_bandwidth="cloud-v5e",
                 ici_links="cloud-v5e", topology="cloud-v5e", dcn_bandwidth="cloud-v5e",
                 pcie_bandwidth="scaling-book", price_per_hour="scaling-book-pricing",
                 tensorcores="cloud-v5e", mxus_per_core="cloud-v5e", mxu_size="scaling-book",
                 vmem_bytes="scaling-book", chips_per_host="scaling-book",
                 ici_domain_chips="cloud-v5e", max_slice_chips="cloud-v5e",
                 vmem_bandwidth="scaling-book"),
))
_add(_chip(
    name="tpu-v5p", vendor="Google", display_name="TPU v5p",
    bf16_flops=4.59e14, int8_flops=9.18e14,
    hbm_bytes=95 * GiB, hbm_unit="GiB", hbm_bandwidth=2.765e12,
    # 1,200 GB/s bidirectional per chip over 6 links (3D torus) -> 100 GB/s per link per direction.
    ici_link_bandwidth=1e11, ici_links=6, topology="3D torus",
    dcn_bandwidth=6.25e9, pcie_bandwidth=1.5e10, price_per_hour=4.20,
    notes="95 GiB is the usable HBM; 96 GiB is physical.",
    tensorcores=2, mxus_per_core=4, mxu_size=128, vmem_bytes=None, chips_per_host=4,
    ici_domain_chips=8960, max_slice_chips=6144, vector_flops=1.4336e13,
    sources=dict(bf16_flops="cloud-v5p", int8_flops="scaling-book", hbm_bytes="cloud-v5p",
                 hbm_bandwidth="cloud-v5p", ici_link_bandwidth="cloud-v5p",
                 ici_links="scaling-book", topology="cloud-v5p", dcn_bandwidth="cloud-v5p",
                 pcie_bandwidth="scaling-book", price_per_hour="scaling-book-pricing",
                 tensorcores="cloud-v5p-slices", mxus_per_core="cloud-v5p", mxu_size="scaling-book",
                 chips_per_host="cloud-v5p-slices", ici_domain_chips="cloud-v5p",
                 max_slice_chips="cloud-v5p-slices", vector_flops="scaling-book-vpu"),
))
_add(_chip(
    name="tpu-v6e", vendor="Google", display_name="TPU v6e (Trillium)",
    bf16_flops=9.18e14, int8_flops=1.836e15,
    hbm_bytes=32e9, hbm_bandwidth=1.638e12,
    ici_link_bandwidth=1e11, ici_links=4, topology="2D torus",
    # DCN: Google's pages now give 4 x 200 Gbps NICs per 8-chip host (100 Gbps per chip);
    # not stored yet, because chapter 5's tests and tables assume v6e has no DCN figure.
    dcn_bandwidth=None, pcie_bandwidth=3.2e10, price_per_hour=None,
    notes="Google's v6e page gives 2 MXUs per TensorCore, but with 2 the bf16 peak implies "
          "a 3.5 GHz clock, twice any other TPU's; with 4 it implies v5p's 1.75 GHz, so the "
          "book assumes 4 (derived, medium confidence).",
    tensorcores=1, mxus_per_core=4, mxu_size=256, vmem_bytes=None, chips_per_host=8,
    ici_domain_chips=256, max_slice_chips=256, vector_flops=None,
    sources=dict(bf16_flops="cloud-v6e", int8_flops="cloud-v6e", hbm_bytes="cloud-v6e",
                 hbm_bandwidth="cloud-v6e", ici_link_bandwidth="cloud-v6e",
                 ici_links="cloud-v6e", topology="cloud-v6e", pcie_bandwidth="scaling-book",
                 tensorcores="cloud-v6e", mxus_per_core="google-trillium", mxu_size="cloud-v6e",
                 chips_per_host="cloud-v6e", ici_domain_chips="cloud-v6e",
                 max_slice_chips="cloud-v6e"),
))
_add(_chip(
    name="gpu-a100", vendor="NVIDIA", display_name="A100 SXM 80GB",
    bf16_flops=3.12e14, int8_flops=6.24e14,
    hbm_bytes=80e9, hbm_bandwidth=2.039e12,
    # NVLink 3: 12 links x 25 GB/s per direction = 300 GB/s per direction per GPU.
    ici_link_bandwidth=2.5e10, ici_links=12, topology="NVSwitch, 8 GPUs per node",
    dcn_bandwidth=2.5e10, pcie_bandwidth=3.2e10, price_per_hour=None,
    tensorcores=None, mxus_per_core=None, mxu_size=None, vmem_bytes=None, chips_per_host=8,
    ici_domain_chips=8, max_slice_chips=8, vector_flops=1.95e13,
    sm_count=108, tensor_cores_per_sm=4, cuda_cores_per_sm=64, tensor_flops_per_sm_clock=2048,
    tensor_clock=1.41e9, boost_clock=1.41e9, register_bytes_per_sm=256 * KiB,
    l1_bytes_per_sm=192 * KiB, smem_bytes_per_sm=164 * KiB, l2_bytes=40 * MiB,
    sources=dict(bf16_flops="nv-a100", int8_flops="nv-a100", hbm_bytes="nv-a100",
                 hbm_bandwidth="nv-a100", ici_link_bandwidth="nv-a100", ici_links="nv-a100",
                 topology="nv-dgx-a100", dcn_bandwidth="nv-dgx-a100", pcie_bandwidth="nv-a100",
                 chips_per_host="nv-dgx-a100", ici_domain_chips="nv-dgx-a100",
                 max_slice_chips="nv-dgx-a100", vector_flops="nv-a100",
                 sm_count="nv-ampere-whitepaper", tensor_cores_per_sm="nv-ampere-whitepaper",
                 cuda_cores_per_sm="nv-ampere-whitepaper",
                 tensor_flops_per_sm_clock="nv-forum-tc-rate",
                 tensor_clock="nv-ampere-whitepaper", boost_clock="nv-ampere-whitepaper",
                 register_bytes_per_sm="cuda-guide-cc", l1_bytes_per_sm="nv-ampere-whitepaper",
                 smem_bytes_per_sm="cuda-guide-cc", l2_bytes="nv-ampere-whitepaper"),
))
_add(_chip(
    name="gpu-h100", vendor="NVIDIA", display_name="H100 SXM",
    bf16_flops=9.89e14, fp8_flops=1.979e15,
    hbm_bytes=80e9, hbm_bandwidth=3.35e12,
    # NVLink 4: 18 links x 25 GB/s per direction = 450 GB/s per direction (900 GB/s "bidirectional").
    ici_link_bandwidth=2.5e10, ici_links=18, topology="NVSwitch, 8 GPUs per node",
    dcn_bandwidth=5e10, pcie_bandwidth=6.4e10, price_per_hour=10.8,
    notes="80 GB as the datasheet states; the device has 80 GiB, of which nvidia-smi "
          "reports 81,559 MiB (DEVICE_REPORTED_HBM): the book plans with the datasheet's "
          "smaller figure.",
    tensorcores=None, mxus_per_core=None, mxu_size=None, vmem_bytes=None, chips_per_host=8,
    ici_domain_chips=8, max_slice_chips=8, vector_flops=6.7e13,
    sm_count=132, tensor_cores_per_sm=4, cuda_cores_per_sm=128, tensor_flops_per_sm_clock=4096,
    tensor_clock=1.83e9, boost_clock=1.98e9, register_bytes_per_sm=256 * KiB,
    l1_bytes_per_sm=256 * KiB, smem_bytes_per_sm=228 * KiB, l2_bytes=50 * MiB,
    sources=dict(sm_count="nv-hopper-whitepaper", tensor_cores_per_sm="nv-hopper-whitepaper",
                 cuda_cores_per_sm="nv-hopper-whitepaper",
                 tensor_flops_per_sm_clock="nv-forum-tc-rate",
                 tensor_clock="nv-hopper-whitepaper", boost_clock="nv-hopper-whitepaper",
                 register_bytes_per_sm="cuda-guide-cc", l1_bytes_per_sm="nv-hopper-whitepaper",
                 smem_bytes_per_sm="cuda-guide-cc", l2_bytes="nv-hopper-whitepaper",
                 bf16_flops="nv-h100", fp8_flops="nv-h100", hbm_bytes="nv-h100",
                 hbm_bandwidth="nv-h100", ici_link_bandwidth="nv-h100", ici_links="nv-h100",
                 topology="nv-dgx-h100", dcn_bandwidth="nv-dgx-h100", pcie_bandwidth="nv-h100",
                 price_per_hour="scaling-book-pricing",
                 chips_per_host="nv-dgx-h100", ici_domain_chips="nv-dgx-h100",
                 max_slice_chips="nv-dgx-h100", vector_flops="nv-h100"),
))
_add(_chip(
    name="gpu-h200", vendor="NVIDIA", display_name="H200 SXM",
    bf16_flops=9.89e14, fp8_flops=1.979e15,
    hbm_bytes=141e9, hbm_bandwidth=4.8e12,
    ici_link_bandwidth=2.5e10, ici_links=18, topology="NVSwitch, 8 GPUs per node",
    dcn_bandwidth=5e10, pcie_bandwidth=6.4e10, price_per_hour=None,
    tensorcores=None, mxus_per_core=None, mxu_size=None, vmem_bytes=None, chips_per_host=8,
    ici_domain_chips=8, max_slice_chips=8, vector_flops=6.7e13,
    sm_count=132, tensor_cores_per_sm=4, cuda_cores_per_sm=128, tensor_flops_per_sm_clock=4096,
    tensor_clock=1.83e9, boost_clock=1.98e9, register_bytes_per_sm=256 * KiB,
    l1_bytes_per_sm=256 * KiB, smem_bytes_per_sm=228 * KiB, l2_bytes=50 * MiB,
    sources=dict(sm_count="nv-h200-gh100", tensor_cores_per_sm="nv-h200-gh100",
                 cuda_cores_per_sm="nv-h200-gh100", tensor_flops_per_sm_clock="nv-h200-gh100",
                 tensor_clock="nv-h200-gh100", boost_clock="nv-h200-gh100",
                 register_bytes_per_sm="cuda-guide-cc", l1_bytes_per_sm="nv-h200-gh100",
                 smem_bytes_per_sm="cuda-guide-cc", l2_bytes="nv-h200-gh100",
                 bf16_flops="nv-h200", fp8_flops="nv-h200", hbm_bytes="nv-h200",
                 hbm_bandwidth="nv-h200", ici_link_bandwidth="nv-h200", ici_links="nv-h200",
                 topology="nv-h200", dcn_bandwidth="nv-dgx-basepod",
                 pcie_bandwidth="mlperf-h200", chips_per_host="nv-h200",
                 ici_domain_chips="nv-h200", max_slice_chips="nv-h200",
                 vector_flops="nv-h200"),
))
_add(_chip(
    name="gpu-b200", vendor="NVIDIA", display_name="B200 (HGX/DGX)",
    bf16_flops=2.25e15, fp8_flops=4.5e15,
    hbm_bytes=180e9, hbm_bandwidth=8e12,
    # NVLink 5: 18 links x 50 GB/s per direction = 900 GB/s per direction (1.8 TB/s total).
    ici_link_bandwidth=5e10, ici_links=18, topology="NVSwitch, 8 GPUs per node",
    dcn_bandwidth=5e10, pcie_bandwidth=6.4e10, price_per_hour=None,
    notes="180 GB per GPU in DGX B200 datasheets; 192 GB in early announcements.",
    tensorcores=None, mxus_per_core=None, mxu_size=None, vmem_bytes=None, chips_per_host=8,
    ici_domain_chips=8, max_slice_chips=8, vector_flops=7.5e13,
    # NVIDIA publishes no clock, per-SM tensor rate, L1 or L2 for the B200; the SM count and
    # the cores per SM are scaling-book's (secondary), the register file and the shared
    # memory per SM CUDA's for compute capability 10.0.
    sm_count=148, tensor_cores_per_sm=4, cuda_cores_per_sm=128,
    register_bytes_per_sm=256 * KiB, smem_bytes_per_sm=228 * KiB,
    sources=dict(sm_count="scaling-book-gpus", tensor_cores_per_sm="scaling-book-gpus",
                 cuda_cores_per_sm="scaling-book-gpus", register_bytes_per_sm="cuda-guide-cc",
                 smem_bytes_per_sm="cuda-guide-cc", bf16_flops="nv-hgx", fp8_flops="nv-dgx-b200", hbm_bytes="nv-dgx-b200",
                 hbm_bandwidth="nv-dgx-b200", ici_link_bandwidth="nv-hgx", ici_links="nv-hgx",
                 topology="nv-dgx-b200", dcn_bandwidth="nv-dgx-b200", pcie_bandwidth="nv-hgx",
                 chips_per_host="nv-dgx-b200", ici_domain_chips="nv-dgx-b200",
                 max_slice_chips="nv-dgx-b200", vector_flops="nv-hgx"),
))


def chip_names() -> list[str]:
    """The canonical chip names, TPUs first."""
    return list(_CHIPS)


def all_chips() -> list[Chip]:
    return list(_CHIPS.values())


def get_chip(name) -> Chip:
    """Look up a chip by canonical name ("tpu-v5e", "gpu-h100", ...).

    Case and the separators ``-``/``_``/space are forgiven ("TPU v5e" works). A ``Chip``
    passes through unchanged. An unknown name raises ``KeyError`` listing the known names.
    """
    if isinstance(name, Chip):
        return name
    if not isinstance(name, str):
        raise TypeError(f"chip must be a name such as 'tpu-v5e' or a Chip; got {type(name).__name__}")
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key in _CHIPS:
        return _CHIPS[key]
    for prefix in ("tpu-", "gpu-"):
        if prefix + key in _CHIPS:
            return _CHIPS[prefix + key]
    raise UnknownNameError(f"unknown chip {name!r}; known chips: {', '.join(_CHIPS)}")


def spec_table(chips=None, columns=None) -> list[dict]:
    """Rows (one dict per chip) of the main figures, for printing a table."""
    chips = [get_chip(c) for c in (chips or chip_names())]
    columns = columns or ["bf16_flops", "int8_flops", "fp8_flops", "hbm_bytes", "hbm_bandwidth",
                          "ici_link_bandwidth", "ici_links", "dcn_bandwidth", "price_per_hour"]
    valid = {f.name for f in dataclasses.fields(Chip)} | {"critical_intensity", "ici_bandwidth"}
    for c in columns:
        if c not in valid:
            raise ValueError(f"unknown column {c!r}; choose from {sorted(valid)}")
    return [{"chip": chip.name, **{c: getattr(chip, c) for c in columns}} for chip in chips]


# Where this book's figures differ from the widely quoted table of "How to Scale Your Model"
# (Austin et al., 2025, TPU chapter; its earlier version, the one most often quoted): (chip,
# attribute, their value, why ours is chosen). book/hardware.md shows them beside ours;
# tests/test_hardware_pinned.py checks that each still differs and that ours is the stored one.
SCALING_BOOK_DIFFERENCES = (
    ("tpu-v5e", "ici_link_bandwidth", 4.5e10,
     "Google's 400 GB/s both ways per chip over 4 ports, halved for one direction; the later "
     "version of their table has the same 5e10"),
    ("tpu-v5p", "ici_link_bandwidth", 9e10,
     "Google's 1,200 GB/s both ways per chip over 6 ports, halved; their later version: 1e11"),
    ("tpu-v6e", "ici_link_bandwidth", 9e10,
     "Google's 800 GB/s both ways per chip over 4 ports, halved; their later version: 1e11"),
    ("tpu-v5p", "hbm_bytes", 96e9,
     "Google lists 95 GiB that a program can allocate (96 GiB physical); ours is the usable "
     "amount, in the vendor's unit"),
)


# Figures that no vendor states but that follow from a cited architecture description:
# (chip, attribute, factors whose product is the stored figure, how, confidence). The
# hardware page lists them; tests/test_hardware_pinned.py checks each product.
DERIVED_FIGURES = (
    ("tpu-v5p", "vector_flops",
     {"sublanes": 8, "lanes": 128, "ALUs per lane": 4, "clock (Hz)": 1.75e9,
      "TensorCores": 2},
     "the VPU of each TensorCore is 8 x 128 lanes with 4 f32 ALUs each (scaling-book, TPU "
     "chapter, appendix on the VPU), one operation per ALU per cycle (a fused multiply-add "
     "not counted as two), at the 1.75 GHz that v5p's bf16 peak implies over its MXUs "
     "(chip_internals.implied_clock)",
     "medium: an architecture description and an approximate clock, not a Google spec"),
    ("tpu-v5e", "vmem_bandwidth", {"HBM bandwidth (bytes/s)": 8.19e11, "VMEM / HBM": 22},
     "'VMEM bandwidth is around 22x higher than HBM bandwidth' (scaling-book, TPU chapter), "
     "applied to the v5e's HBM",
     "low: a rounded ratio from one description, not a measured or published figure"),
)


# A chip too new for the main table. Most of its figures are on Google's TPU7x page, but
# some that the book's formulas need (links per chip, and so the bandwidth of one link) come
# from the press. It is not in chip_names() or all_chips(), so no chapter's table changes;
# any function that takes a chip takes it. PREVIEW_CONFIDENCE says how sure each figure is.
_PREVIEW: dict[str, Chip] = {
    "tpu7x": Chip(
        name="tpu7x", vendor="Google", display_name="TPU7x (Ironwood, preview)",
        bf16_flops=2.307e15, fp8_flops=4.614e15,
        hbm_bytes=192 * GiB, hbm_unit="GiB", hbm_bandwidth=7.38e12,
        # 1,200 GB/s both ways per chip (Google) over the 6 links a 3D torus needs, halved:
        # 1e11, as on the v5p (the press's "four links" cannot make a 3D torus).
        ici_link_bandwidth=1.2e12 / 6 / 2, ici_links=6, topology="3D torus",
        # 100 Gbps of DCN per chip.
        dcn_bandwidth=1.25e10, pcie_bandwidth=None, price_per_hour=None,
        tensorcores=2, mxus_per_core=None, mxu_size=None, vmem_bytes=None,
        chips_per_host=4, ici_domain_chips=9216, max_slice_chips=None,
        notes="Preview: figures from Google's TPU7x page except where PREVIEW_CONFIDENCE "
              "says otherwise.",
        sources=dict(bf16_flops="cloud-tpu7x", fp8_flops="cloud-tpu7x",
                     hbm_bytes="cloud-tpu7x", hbm_bandwidth="cloud-tpu7x",
                     ici_link_bandwidth="press-ironwood", ici_links="press-ironwood",
                     topology="press-ironwood", dcn_bandwidth="cloud-tpu7x",
                     tensorcores="cloud-tpu7x", chips_per_host="cloud-tpu7x",
                     ici_domain_chips="cloud-tpu7x"),
    ),
}

# The H800: the H100's silicon with NVLink cut to 8 links (400 GB/s both ways, 200 GB/s per
# direction) for export; DeepSeek-V3 trained on 2,048 of them. NVIDIA's own page for it is
# not among this book's checked sources, so it is a preview: PREVIEW_CONFIDENCE says which
# figure rests on what. Its compute and memory are the H100's (the same GH100 die).
_h100 = _CHIPS["gpu-h100"]
_PREVIEW["gpu-h800"] = dataclasses.replace(
    _h100, name="gpu-h800", display_name="H800 SXM (preview)", ici_links=8,
    price_per_hour=None,
    notes="Preview: the H100 with 8 NVLink links; DeepSeek-V3 (§3.2.2) states 160 GB/s "
          "of NVLink and 50 GB/s of InfiniBand per GPU in its cluster.",
    sources={**{k: v for k, v in _h100.sources.items() if k != "price_per_hour"},
             "ici_links": "deepseekv3", "dcn_bandwidth": "deepseekv3"})

# GB200 NVL72: the B200's die at a higher power, two GPUs and one Grace CPU per superchip,
# 72 GPUs (36 superchips) in one NVLink domain through the rack's NVLink switches. A preview
# because NVIDIA's rack page is the only source for most figures, and its per-GPU peak is
# the rack's divided by 72.
_b200 = _CHIPS["gpu-b200"]
_PREVIEW["gpu-gb200"] = dataclasses.replace(
    _b200, name="gpu-gb200", display_name="GB200 NVL72 (preview)",
    bf16_flops=360e15 / 72 / 2, fp8_flops=None, hbm_bytes=186e9, hbm_bandwidth=8e12,
    topology="NVSwitch, 72 GPUs per NVLink domain (NVL72 rack)", chips_per_host=2,
    ici_domain_chips=72, max_slice_chips=72, pcie_bandwidth=None, vector_flops=None,
    price_per_hour=None,
    notes="Preview: the rack's figures per GPU (NVIDIA's GB200 NVL72 page); one 400 Gb/s "
          "NIC per GPU as in scaling-book's GB200 SuperPOD description.",
    sources={**{k: v for k, v in _b200.sources.items()
                if k in ("ici_link_bandwidth", "ici_links", "sm_count", "tensor_cores_per_sm",
                         "cuda_cores_per_sm", "register_bytes_per_sm", "smem_bytes_per_sm")},
             "bf16_flops": "nv-gb200-nvl72", "hbm_bytes": "nv-gb200-nvl72",
             "hbm_bandwidth": "nv-gb200-nvl72", "topology": "nv-gb200-nvl72",
             "chips_per_host": "nv-gb200-nvl72", "ici_domain_chips": "nv-gb200-nvl72",
             "max_slice_chips": "nv-gb200-nvl72", "dcn_bandwidth": "scaling-book-gpus"})

#: Memory a device itself reports where that differs from its datasheet's figure:
#: chip -> (bytes, source key). The chip table keeps the datasheet's (see the chip's notes).
DEVICE_REPORTED_HBM = {"gpu-h100": (81_559 * MiB, "nvidia-smi-h100")}

PREVIEW_CONFIDENCE = {
    "tpu7x": {
        "bf16_flops": "high: Google's specification table (2,307 TFLOPs)",
        "fp8_flops": "high: Google's specification table (4,614 TFLOPs)",
        "hbm_bytes": "high: Google's specification table (192 GiB)",
        "hbm_bandwidth": "high: Google's specification table (7,380 GBps)",
        "ici_links": "low: the 6 links a 3D torus needs; Google's page gives no count and a "
                     "press report of four links cannot make a 3D torus",
        "ici_link_bandwidth": "low: Google's 1,200 GBps both ways per chip over 6 links, "
                              "halved for one direction (1.5x more per link with 4)",
        "topology": "medium: press reports a 3D torus; Google's page says only that TPU7x "
                    "'shares many similarities with TPU v5p'",
        "dcn_bandwidth": "high: Google's specification table (100 Gbps per chip)",
        "tensorcores": "high: Google's page (two TensorCores and four SparseCores per chip)",
        "chips_per_host": "high: Google's page (4-chip VMs)",
        "ici_domain_chips": "high: Google's page (9,216 chips per pod)",
    },
    "gpu-h800": {
        "bf16_flops": "medium: the H100's; the H800 is the same die, cut in NVLink and FP64 "
                      "(secondary sources); DeepSeek-V3 reports no peak",
        "ici_links": "medium: 8 NVLink 4 links, 400 GB/s both ways as NVIDIA lists the H800 "
                     "(secondary sources); DeepSeek-V3 states 160 GB/s for its cluster",
        "dcn_bandwidth": "high: DeepSeek-V3 §3.2.2, 50 GB/s InfiniBand per GPU",
    },
    "gpu-gb200": {
        "bf16_flops": "medium: NVIDIA's 360 PFLOPS of sparse BF16 per rack, halved for dense "
                      "and divided by 72 GPUs",
        "hbm_bytes": "high: NVIDIA's rack page (186 GB per GPU)",
        "hbm_bandwidth": "high: NVIDIA's rack page (8 TB/s per GPU)",
        "ici_domain_chips": "high: NVIDIA's rack page (72 GPUs in one NVLink domain)",
        "ici_link_bandwidth": "high: NVLink 5, 18 links of 50 GB/s each way (1.8 TB/s per "
                              "GPU, 130 TB/s per rack)",
        "chips_per_host": "high: two B200 GPUs and one Grace CPU per GB200 superchip",
        "dcn_bandwidth": "medium: one 400 Gb/s NIC per GPU (scaling-book's GB200 SuperPOD)",
    },
}


def preview_chip(name: str) -> Chip:
    """A chip whose record is a preview (not every figure is published): ``"tpu7x"``.

    Not listed by :func:`chip_names`; see :data:`PREVIEW_CONFIDENCE` for how sure each
    figure is. Also ``"gpu-h800"`` and ``"gpu-gb200"`` (one GPU of a GB200 NVL72 rack)."""
    key = str(name).strip().lower()
    if key not in _PREVIEW:
        raise UnknownNameError(f"unknown preview chip {name!r}; preview chips: "
                               f"{', '.join(_PREVIEW)}")
    return _PREVIEW[key]
