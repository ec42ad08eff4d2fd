"""Transformer configurations, with LLaMA-3 8B, 70B and 405B built in.

Sources: meta-llama/llama-models (``models/llama3_1/api/sku_list.py`` and the reference
``models/llama3/model.py``) and the LLaMA-3 paper, arXiv:2407.21783, Table 3.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UnknownNameError
from .units import check_positive_int

__all__ = ["TransformerConfig", "get_model", "model_names"]


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer in the LLaMA style (RMSNorm, RoPE, GQA, SwiGLU, no biases).

    d_model: model width; n_heads: query heads; n_kv_heads: key/value heads;
    head_dim: size of one head; d_ff: hidden width of the gated MLP; vocab_size: rows
    of the embedding; tied_embeddings: whether the output head reuses the embedding.
    """

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    tied_embeddings: bool = False

    def __post_init__(self):
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size"):
            check_positive_int(f, getattr(self, f))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: n_heads={self.n_heads} must be a multiple of "
                             f"n_kv_heads={self.n_kv_heads} (each key/value head serves a group "
                             f"of query heads)")


_MODELS = {
    "llama3-8b": TransformerConfig("llama3-8b", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
                                   head_dim=128, d_ff=14336, vocab_size=128256),
    "llama3-70b": TransformerConfig("llama3-70b", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8,
                                    head_dim=128, d_ff=28672, vocab_size=128256),
    "llama3-405b": TransformerConfig("llama3-405b", n_layers=126, d_model=16384, n_heads=128,
                                     n_kv_heads=8, head_dim=128, d_ff=53248, vocab_size=128256),
}


def model_names() -> list[str]:
    return list(_MODELS)


def get_model(name) -> TransformerConfig:
    """One of "llama3-8b", "llama3-70b", "llama3-405b" (a config passes through)."""
    if isinstance(name, TransformerConfig):
        return name
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-").replace("llama-3", "llama3")
    if key not in _MODELS:
        raise UnknownNameError(f"unknown model {name!r}; known models: {', '.join(_MODELS)}")
    return _MODELS[key]
