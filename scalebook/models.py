"""Transformer configurations and their arithmetic, with LLaMA-3 8B, 70B and 405B built in.

A :class:`TransformerConfig` describes a decoder-only transformer in the LLaMA style:
RMSNorm before attention and before the MLP, rotary position embeddings (no parameters),
grouped-query attention (``n_kv_heads`` key/value heads shared by ``n_heads`` query heads),
a gated SwiGLU MLP with three matrices, no biases, a final RMSNorm and an output head that
is a separate matrix unless ``tied_embeddings``. :class:`MoEConfig` replaces each MLP by
``n_experts`` such MLPs and a router (Mixtral 8x7B built in).

Symbols used in the docstrings (the book's notation page; the chapter uses the same ones):

    L = n_layers      D = d_model       H = n_heads     H_kv = n_kv_heads
    h = head_dim      F = d_ff          V = vocab_size  S = sequence length
    T = context (keys each query sees)  G = H / H_kv    E, k = experts, experts per token

Parameters (exact): ``V D`` (embedding) + ``L [D H h + 2 D H_kv h + H h D]`` (attention:
q, k, v, o) + ``L (3 D F)`` (MLP) + ``L (2 D)`` (two RMSNorm gains) + ``D`` (final norm) +
``V D`` (output head, absent when tied).

FLOPs are counted as 2 per multiply-add (:func:`einsum_flops` states the general rule).
Only matrix multiplications are counted; the elementwise work (norms, rotary embeddings,
softmax, SiLU, residual adds) is a few FLOPs per element and is left out: chapter 4
measures how small it is with XLA's cost analysis.

Sources: meta-llama/llama-models (``models/llama3_1/api/sku_list.py`` and the reference
``models/llama3/model.py``) and the LLaMA-3 paper, arXiv:2407.21783, Table 3; Mixtral:
arXiv:2401.04088, Table 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import roofline as _rl
from .errors import UnknownNameError
from .units import check_nonnegative, check_positive, check_positive_int

__all__ = ["TransformerConfig", "ParamBreakdown", "TrainingMemory", "Matmul", "MoEConfig",
           "MLAConfig", "DEEPSEEK_V3_MLA",
           "get_model", "model_names", "einsum_flops", "REMAT_POLICIES", "MIXTRAL_8X7B",
           "PUBLISHED_PARAMS", "LLAMA3_405B_TOKENS", "LLAMA3_405B_FLOPS",
           "LLAMA3_MODEL_CARD", "MIXTRAL_PUBLISHED", "SOURCES"]

# Published facts about the LLaMA-3 models, each with its source (see SOURCES).
PUBLISHED_PARAMS = {   # parameter counts in the Hugging Face safetensors metadata
    "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "llama3-405b": 405_853_388_800}
LLAMA3_405B_TOKENS = 15.6e12   # pre-training text tokens of the 405B model (paper, §1 and §2)
LLAMA3_405B_FLOPS = 3.8e25     # pre-training compute of the 405B model (paper, §1)
# The Llama 3 model card (April 2024): pre-training GPU-hours on H100-80GB and tokens.
LLAMA3_MODEL_CARD = {"llama3-8b": {"gpu_hours": 1.3e6, "tokens": 15e12},
                     "llama3-70b": {"gpu_hours": 6.4e6, "tokens": 15e12}}
# Mixtral 8x7B as its paper rounds it: total and active (per token) parameters.
MIXTRAL_PUBLISHED = {"total": 47e9, "active": 13e9}
LLAMA31_CONTEXT = 131_072      # the LLaMA 3.1 models' longest context, 128K tokens
SOURCES = {
    "PUBLISHED_PARAMS": "Hugging Face model pages of meta-llama/Llama-3.1-{8B,70B,405B} "
                        "(safetensors metadata)",
    "LLAMA3_405B_TOKENS": "Llama Team, The Llama 3 Herd of Models, arXiv:2407.21783, §1-2",
    "LLAMA3_405B_FLOPS": "Llama Team, The Llama 3 Herd of Models, arXiv:2407.21783, §1",
    "configs": "meta-llama/llama-models, models/llama3_1/api/sku_list.py and "
               "models/llama3/model.py; arXiv:2407.21783, Table 3",
    "max_context": "LLaMA 3.1: 128K tokens (131,072), arXiv:2407.21783 §3.4.2 and the "
                   "released configs' max_position_embeddings; Mixtral 32K tokens "
                   "(arXiv:2401.04088 §2); DeepSeek-V3 128K (arXiv:2412.19437 §4.3)",
    "LLAMA3_MODEL_CARD": "Meta, Llama 3 model card (github.com/meta-llama/llama3, "
                         "MODEL_CARD.md): 1.3M and 6.4M H100-80GB GPU-hours for 8B and "
                         "70B, 'over 15 trillion tokens'",
    "MIXTRAL": "Jiang et al., Mixtral of Experts, arXiv:2401.04088, Table 1 (shapes), "
               "abstract and §1 (47B parameters, 13B active per token); rope_theta and the "
               "untied head from the released model configuration",
}

# Remat policies of :meth:`TransformerConfig.saved_values_per_layer_per_token`, each a
# jax.checkpoint policy around one layer (scalebook.llama.remat_policy maps them).
REMAT_POLICIES = ("nothing", "attention_out", "weight_dots", "dots")


def einsum_flops(spec: str, *shapes) -> int:
    """FLOPs of a two-operand ``jnp.einsum(spec, a, b)``: 2 x the product of the sizes of
    all distinct dimension letters, each counted once whether it is a batch dimension (in
    both operands and the output), a contracting one (in both operands, not the output) or
    a free one (in one operand and the output). A letter in only one operand and not in the
    output is a plain sum, not part of the product, and is refused."""
    if not isinstance(spec, str) or spec.count("->") != 1:
        raise ValueError(f"spec must look like 'ij,jk->ik'; got {spec!r}")
    ins, out = spec.replace(" ", "").split("->")
    ops = ins.split(",")
    if len(ops) != 2 or len(shapes) != 2:
        raise ValueError(f"einsum_flops counts two operands; got spec {spec!r} and "
                         f"{len(shapes)} shapes")
    sizes = {}
    for letters, shape in zip(ops, shapes):
        shape = tuple(shape)
        if len(letters) != len(shape):
            raise ValueError(f"operand {letters!r} has {len(letters)} letters but shape "
                             f"{shape}")
        for ch, n in zip(letters, shape):
            n = check_positive_int(f"size of {ch!r}", n)
            if sizes.setdefault(ch, n) != n:
                raise ValueError(f"dimension {ch!r} is {sizes[ch]} in one place and {n} "
                                 f"in another")
    for ch in sizes:
        if ch not in out and not (ch in ops[0] and ch in ops[1]):
            raise ValueError(f"dimension {ch!r} is summed inside one operand; "
                             f"einsum_flops counts products only")
    total = 2
    for n in sizes.values():
        total *= n
    return total


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameter count of a model by part (all exact integers, summed over layers)."""

    embedding: int
    attention: int
    mlp: int
    norms: int
    output_head: int

    @property
    def total(self) -> int:
        return self.embedding + self.attention + self.mlp + self.norms + self.output_head

    def as_dict(self) -> dict:
        return {"embedding": self.embedding, "attention": self.attention, "mlp": self.mlp,
                "norms": self.norms, "output_head": self.output_head}

    def shares(self) -> dict:
        """Each part as a fraction of the total."""
        t = self.total
        return {k: v / t for k, v in self.as_dict().items()}


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes of model state during training, for the whole model (not per chip)."""

    weights: float
    gradients: float
    master_weights: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.master_weights + self.optimizer

    def as_dict(self) -> dict:
        return {"weights": self.weights, "gradients": self.gradients,
                "master_weights": self.master_weights, "optimizer": self.optimizer}


@dataclass(frozen=True)
class Matmul:
    """One matrix multiplication ``lhs @ rhs -> out`` of a transformer.

    Shapes are tuples; leading dimensions of ``lhs`` beyond the last are batch-like
    (``batch`` counts how many independent [m, k] @ [k, n] products there are).
    ``flops`` = 2 * batch * m * k * n; ``bytes`` = bytes_per_element * (size of lhs + rhs + out),
    each array crossing HBM once.
    """

    name: str
    lhs: tuple
    rhs: tuple
    out: tuple
    flops: int
    bytes: float
    is_weight: bool   # True when rhs is a parameter matrix (counts towards 2 N per token)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def _exact(x: float):
    """An int when ``x`` is a whole number (so byte counts compare exactly), else ``x``."""
    return int(x) if float(x).is_integer() else x


def _check_tokens(name, value) -> float:
    """A token count: a finite number >= 0 (it may be a float, e.g. 15.6e12)."""
    return check_nonnegative(name, value)


def _check_seq_len(value) -> int:
    return check_positive_int("seq_len", value)


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer in the LLaMA style (RMSNorm, RoPE, GQA, SwiGLU, no biases).

    d_model: model width; n_heads: query heads; n_kv_heads: key/value heads;
    head_dim: size of one head; d_ff: hidden width of the gated MLP; vocab_size: rows
    of the embedding; tied_embeddings: whether the output head reuses the embedding;
    rope_theta: base of the rotary frequencies; norm_eps: RMSNorm epsilon.

    ``n_heads * head_dim`` need not equal ``d_model`` (the q and o projections are
    [d_model, n_heads * head_dim] and back), but ``n_heads`` must be a multiple of
    ``n_kv_heads`` and ``head_dim`` must be even (rotary embeddings rotate pairs).
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
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    max_context: int | None = None    # longest context the released model supports

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string; got {self.name!r}")
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size"):
            try:
                check_positive_int(f, getattr(self, f))
            except ValueError as e:
                raise ValueError(f"{self.name}: {e}") from None
        if not isinstance(self.tied_embeddings, bool):
            raise ValueError(f"{self.name}: tied_embeddings must be True or False; "
                             f"got {self.tied_embeddings!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: n_heads={self.n_heads} must be a multiple of "
                             f"n_kv_heads={self.n_kv_heads} (each key/value head serves a group "
                             f"of query heads)")
        if self.head_dim % 2:
            raise ValueError(f"{self.name}: head_dim={self.head_dim} must be even (rotary "
                             f"embeddings rotate pairs of dimensions)")
        for f in ("rope_theta", "norm_eps"):
            try:
                check_positive(f, getattr(self, f))
            except ValueError as e:
                raise ValueError(f"{self.name}: {e}") from None
        if self.max_context is not None:
            try:
                check_positive_int("max_context", self.max_context)
            except ValueError as e:
                raise ValueError(f"{self.name}: {e}") from None

    def check_context(self, tokens, what: str = "context") -> int:
        """``tokens`` as a positive int, refused (ValueError with both numbers) beyond the
        model's ``max_context`` (when it has one)."""
        T = check_positive_int(what, tokens)
        if self.max_context is not None and T > self.max_context:
            raise ValueError(f"{what}={T:,} tokens is longer than the {self.max_context:,} "
                             f"{self.name} supports (max_context)")
        return T

    # -- shapes ---------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of all query heads together: H h."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or all value) heads together: H_kv h."""
        return self.n_kv_heads * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: G = H / H_kv."""
        return self.n_heads // self.n_kv_heads

    # -- parameters -----------------------------------------------------------------------
    def attention_params_per_layer(self) -> int:
        """q: D x Hh, k and v: D x H_kv h each, o: Hh x D."""
        d = self.d_model
        return d * self.q_dim + 2 * d * self.kv_dim + self.q_dim * d

    def mlp_params_per_layer(self) -> int:
        """Gate and up: D x F each, down: F x D."""
        return 3 * self.d_model * self.d_ff

    def norm_params_per_layer(self) -> int:
        """Two RMSNorm gain vectors of size D (before attention, before the MLP)."""
        return 2 * self.d_model

    def params_per_layer(self) -> int:
        return (self.attention_params_per_layer() + self.mlp_params_per_layer()
                + self.norm_params_per_layer())

    def param_breakdown(self) -> ParamBreakdown:
        """Exact parameter counts by part; norms include the final RMSNorm."""
        L, d, V = self.n_layers, self.d_model, self.vocab_size
        return ParamBreakdown(
            embedding=V * d,
            attention=L * self.attention_params_per_layer(),
            mlp=L * self.mlp_params_per_layer(),
            norms=L * self.norm_params_per_layer() + d,
            output_head=0 if self.tied_embeddings else V * d,
        )

    def num_params(self) -> int:
        """Total number of parameters (exact)."""
        return self.param_breakdown().total

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul for every token: all but the norms, and
        the embedding table unless it doubles as the output head (a lookup is not a matmul).
        The dense forward pass costs 2 * matmul_params() FLOPs per token."""
        b = self.param_breakdown()
        head = b.embedding if self.tied_embeddings else b.output_head
        return b.attention + b.mlp + head

    # -- FLOPs ----------------------------------------------------------------------------
    def attention_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Forward FLOPs per token of the two attention matmuls (scores q.k and the weighted
        sum of values), over all layers: 4 L S H h.

        Each token's query meets S keys: 2 S h FLOPs per head for q.k and 2 S h for the sum
        of values. ``causal=False`` counts the whole S x S score matrix (what a plain
        implementation computes before masking); ``causal=True`` counts only the unmasked
        half, S (S + 1) / 2 pairs, i.e. (S + 1) / 2 keys per token on average (a kernel that
        skips masked blocks)."""
        S = _check_seq_len(seq_len)
        keys = (S + 1) / 2 if causal else S
        return 4 * self.n_layers * self.n_heads * self.head_dim * keys

    def dense_flops_per_token(self) -> int:
        """Forward FLOPs per token of the weight matmuls: 2 * matmul_params()."""
        return 2 * self.matmul_params()

    def forward_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Forward FLOPs per token: weight matmuls plus attention at ``seq_len``."""
        return self.dense_flops_per_token() + self.attention_flops_per_token(seq_len, causal)

    def backward_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Backward FLOPs per token: twice the forward. Each matmul X @ W needs two matmuls
        of the same size in the backward pass, dX = dY W^T and dW = X^T dY (and for the
        attention matmuls, the gradients with respect to both operands)."""
        return 2 * self.forward_flops_per_token(seq_len, causal)

    def training_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Forward + backward FLOPs per token: 3 x forward."""
        return 3 * self.forward_flops_per_token(seq_len, causal)

    def training_flops(self, tokens: float) -> float:
        """The 6 N N_tok rule: 6 * num_params() * tokens (forward 2N, backward 4N per token;
        attention and elementwise work excluded, every parameter counted, as in the
        LLaMA-3 paper's compute figure)."""
        return 6 * self.num_params() * _check_tokens("tokens", tokens)

    def training_attention_flops(self, tokens: float, seq_len: int, causal: bool = False) -> float:
        """The attention term of training: 3 x attention_flops_per_token x tokens."""
        return 3 * self.attention_flops_per_token(seq_len, causal) * _check_tokens("tokens", tokens)

    def training_flops_with_attention(self, tokens: float, seq_len: int,
                                      causal: bool = False) -> float:
        """6 N N_tok plus the attention FLOPs of training on sequences of length ``seq_len``."""
        return self.training_flops(tokens) + self.training_attention_flops(tokens, seq_len, causal)

    # -- matmul map -----------------------------------------------------------------------
    def layer_matmuls(self, batch: int, seq_len: int, bytes_per_element: float = 2) -> list[Matmul]:
        """Every matmul of one transformer layer's forward pass for ``batch`` sequences of
        ``seq_len`` tokens, with shapes, FLOPs and bytes (each operand read once from HBM,
        the result written once, ``bytes_per_element`` bytes each).

        The attention matmuls are written per (sequence, head): the scores are
        [S, h] @ [h, S] for each of the B_seq H query heads (a key head is shared by G of
        them), and the weighted sum is [S, S] @ [S, h]. The score matrix is counted in full
        (S x S), as a plain implementation computes it."""
        B, S = check_positive_int("batch", batch), _check_seq_len(seq_len)
        s = check_positive("bytes_per_element", bytes_per_element)
        T, d, F, H, K, h = B * S, self.d_model, self.d_ff, self.n_heads, self.n_kv_heads, self.head_dim

        def weight(name, k, n):
            return Matmul(name, (T, k), (k, n), (T, n), _rl.matmul_flops(T, k, n),
                          _rl.matmul_bytes(T, k, n, s), True)

        # Attention matmuls: B*H products; the keys/values are read once per key head.
        scores = Matmul("attention scores q.k", (B, H, S, h), (B, K, h, S), (B, H, S, S),
                        2 * B * H * S * h * S, s * (B * H * S * h + B * K * h * S + B * H * S * S),
                        False)
        values = Matmul("attention weighted sum of v", (B, H, S, S), (B, K, S, h), (B, H, S, h),
                        2 * B * H * S * S * h, s * (B * H * S * S + B * K * S * h + B * H * S * h),
                        False)
        return [
            weight("q projection", d, H * h),
            weight("k projection", d, K * h),
            weight("v projection", d, K * h),
            scores,
            values,
            weight("o projection", H * h, d),
            weight("MLP gate", d, F),
            weight("MLP up", d, F),
            weight("MLP down", F, d),
        ]

    def head_matmul(self, batch: int, seq_len: int, bytes_per_element: float = 2) -> Matmul:
        """The output head: [B_seq S, D] @ [D, V] -> logits."""
        T = check_positive_int("batch", batch) * _check_seq_len(seq_len)
        s = check_positive("bytes_per_element", bytes_per_element)
        d, V = self.d_model, self.vocab_size
        return Matmul("output head", (T, d), (d, V), (T, V), _rl.matmul_flops(T, d, V),
                      _rl.matmul_bytes(T, d, V, s), True)

    # -- memory ---------------------------------------------------------------------------
    def weight_bytes(self, bytes_per_element: float = 2) -> float:
        """Bytes of all parameters at ``bytes_per_element`` (2 for bf16)."""
        return _exact(self.num_params() * check_positive("bytes_per_element", bytes_per_element))

    def training_memory(self, weight_bytes: float = 2, grad_bytes: float = 2,
                        master_bytes: float = 4, optimizer_bytes: float = 8) -> TrainingMemory:
        """Model state for mixed-precision training with Adam, in bytes (whole model).

        Per parameter: ``weight_bytes`` for the working copy used in forward and backward
        (bf16: 2), ``grad_bytes`` for its gradient (bf16: 2; 4 if gradients are kept in fp32,
        as the LLaMA-3 paper does), ``master_bytes`` for the fp32 master copy the optimizer
        updates (4; 0 if there is none) and ``optimizer_bytes`` for Adam's two fp32 moments
        (2 x 4 = 8). The defaults give 16 bytes per parameter. Activations are separate
        (:meth:`activation_bytes_per_token`)."""
        N = self.num_params()
        return TrainingMemory(
            weights=N * check_positive("weight_bytes", weight_bytes),
            gradients=N * check_nonnegative("grad_bytes", grad_bytes),
            master_weights=N * check_nonnegative("master_bytes", master_bytes),
            optimizer=N * check_nonnegative("optimizer_bytes", optimizer_bytes),
        )

    def activation_elements_per_layer_per_token(self) -> int:
        """Elements one layer keeps per token for the backward pass, without
        rematerialisation, assuming a fused attention kernel that does not store the S x S
        score matrix (it recomputes it from q, k, v and keeps the output):

        * the layer input x (for the RMSNorm gradient) and the normed input: 2 D
        * q (H h), k and v (H_kv h each) after rotary embedding, and the attention output (H h):
          2 H h + 2 H_kv h
        * the residual after attention and its normed copy: 2 D
        * the MLP gate and up projections (F each) and their SiLU-gated product (F): 3 F

        Total 4 D + 2 H h + 2 H_kv h + 3 F. Per-row statistics (RMSNorm scale, softmax
        log-sum-exp) are a few numbers per token and are left out."""
        d, F = self.d_model, self.d_ff
        return 4 * d + 2 * self.q_dim + 2 * self.kv_dim + 3 * F

    def activation_bytes_per_token(self, remat: bool = False, bytes_per_element: float = 2) -> float:
        """Activation bytes per token of a training step, at the peak (start of backward).

        ``remat=False``: every layer keeps activation_elements_per_layer_per_token()
        elements, so L times that.
        ``remat=True`` (full rematerialisation, one checkpoint per layer): each layer keeps
        only its input (D elements); during the backward pass one layer at a time is
        recomputed, so one layer's full set is alive on top: L D + one layer.

        Both add the head: the final-norm input and output (2 D) and the logits (V), all at
        ``bytes_per_element`` (bf16: 2); an implementation that keeps the logits in f32
        for the loss, as :mod:`scalebook.llama` does, holds 4 V bytes per token for them
        instead. Not included: the S x S score matrices (assumed
        never stored, see above), gradients of activations in flight, and temporary
        buffers of the compiler."""
        s = check_positive("bytes_per_element", bytes_per_element)
        per_layer = self.activation_elements_per_layer_per_token()
        head = 2 * self.d_model + self.vocab_size
        if remat:
            elements = self.n_layers * self.d_model + per_layer + head
        else:
            elements = self.n_layers * per_layer + head
        return _exact(elements * s)

    def saved_values_per_layer_per_token(self, policy: str, context: int = 1) -> int:
        """Values one layer wrapped in ``jax.checkpoint`` keeps per token for its backward
        pass, by policy (the rest is recomputed in the backward pass):

        * "nothing" (nothing_saveable): the layer's input, D.
        * "attention_out" (save_only_these_names("attention_out")): the input and the
          attention output before W_o, D + H h.
        * "weight_dots" (dots_with_no_batch_dims_saveable): the input and the outputs of
          the weight matmuls that the backward pass needs: q, k and v (H h + 2 H_kv h),
          the W_o output (D: the residual x + o W_o feeds the MLP's norm) and the gate and
          up projections (2 F); not W_down's output, which only feeds the next layer.
          2 D + H h + 2 H_kv h + 2 F.
        * "dots" (dots_saveable): also the attention matmuls' outputs, the scores of
          every query head against ``context`` keys (H T) and the weighted sum of the
          values (H h): 2 D + 2 H h + 2 H_kv h + 2 F + H T.

        Counted for the unfused attention of :mod:`scalebook.llama` (a fused kernel has no
        score matmul for a policy to save). Chapter 4 checks each count against the
        residuals JAX keeps."""
        D, F, Hh, kv = self.d_model, self.d_ff, self.q_dim, self.kv_dim
        T = check_positive_int("context", context)
        if policy not in REMAT_POLICIES:
            raise ValueError(f"policy must be one of {REMAT_POLICIES}; got {policy!r}")
        return {"nothing": D, "attention_out": D + Hh,
                "weight_dots": 2 * D + Hh + 2 * kv + 2 * F,
                "dots": 2 * D + 2 * Hh + 2 * kv + 2 * F + self.n_heads * T}[policy]

    def recompute_flops_per_layer_per_token(self, policy: str, context: int) -> float:
        """Matmul FLOPs per token that the backward pass of one checkpointed layer spends
        recomputing its forward, by policy (see :meth:`saved_values_per_layer_per_token`;
        ``context`` T keys per query, full T x T scores as scalebook.llama computes them).

        Only what the backward pass needs is recomputed: never W_down (its output only
        feeds the next layer), and under "attention_out" not the weighted sum of values.
        "nothing": 2 (D H h + 2 D H_kv h + H h D + 2 D F) + 4 T H h;
        "attention_out": the same less 2 T H h; "weight_dots": the two attention matmuls,
        4 T H h; "dots": 0."""
        T = check_positive_int("context", context)
        if policy not in REMAT_POLICIES:
            raise ValueError(f"policy must be one of {REMAT_POLICIES}; got {policy!r}")
        D, F, Hh = self.d_model, self.d_ff, self.q_dim
        attn = 2 * T * Hh                                 # one attention matmul per token
        weights = 2 * (self.attention_params_per_layer() + 2 * D * F)   # not W_down
        return {"nothing": weights + 2 * attn, "attention_out": weights + attn,
                "weight_dots": 2 * attn, "dots": 0}[policy]

    def kv_cache_bytes_per_token(self, bytes_per_element: float = 2) -> float:
        """Bytes of keys and values one token leaves in the cache: 2 L H_kv h x bytes."""
        s = check_positive("bytes_per_element", bytes_per_element)
        return _exact(2 * self.n_layers * self.n_kv_heads * self.head_dim * s)

    def kv_cache_bytes(self, batch: int, context: int, bytes_per_element: float = 2) -> float:
        """Bytes of the KV cache for ``batch`` sequences of ``context`` tokens each."""
        B = check_positive_int("batch", batch)
        S = check_positive_int("context", context)
        return _exact(B * S * self.kv_cache_bytes_per_token(bytes_per_element))

    def scaled(self, **changes) -> "TransformerConfig":
        """A copy with some fields changed (validated again)."""
        from dataclasses import replace
        return replace(self, **changes)


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts transformer: ``dense`` gives the shapes (its ``d_ff`` is one
    expert's hidden width), and every layer's MLP is ``n_experts`` (E) such gated MLPs
    with a router [D, E] (no bias) that sends each token to ``top_k`` (k) of them.

    Total parameters: the dense model's, plus (E - 1) more MLPs and the router per layer.
    Active parameters (those one token meets): k MLPs per layer instead of one, and the
    router. FLOPs per token follow the active count, memory the total."""

    dense: TransformerConfig
    n_experts: int
    top_k: int
    n_shared: int = 0            # experts every token meets as well (DeepSeek's shared)
    dense_layers: int = 0        # the first layers keep one dense MLP of width dense_d_ff
    dense_d_ff: int | None = None

    def __post_init__(self):
        if not isinstance(self.dense, TransformerConfig):
            raise ValueError(f"dense must be a TransformerConfig; got {self.dense!r}")
        E = check_positive_int("n_experts", self.n_experts)
        k = check_positive_int("top_k", self.top_k)
        if k > E:
            raise ValueError(f"top_k={k} experts per token is more than n_experts={E}")
        if isinstance(self.n_shared, bool) or not isinstance(self.n_shared, int) \
                or self.n_shared < 0:
            raise ValueError(f"n_shared must be an integer >= 0; got {self.n_shared!r}")
        if isinstance(self.dense_layers, bool) or not isinstance(self.dense_layers, int) \
                or not 0 <= self.dense_layers < self.dense.n_layers:
            raise ValueError(f"dense_layers must be an integer from 0 to n_layers - 1 = "
                             f"{self.dense.n_layers - 1}; got {self.dense_layers!r}")
        if self.dense_d_ff is not None:
            check_positive_int("dense_d_ff", self.dense_d_ff)

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is the experts: all but the first ``dense_layers``."""
        return self.dense.n_layers - self.dense_layers

    def expert_params(self) -> int:
        """The routed experts' parameters, E gated MLPs in each MoE layer: the part expert
        parallelism splits."""
        return self.moe_layers * self.n_experts * self.dense.mlp_params_per_layer()

    @property
    def name(self) -> str:
        return self.dense.name

    def router_params(self) -> int:
        """L D E: one [D, E] router per MoE layer."""
        return self.moe_layers * self.dense.d_model * self.n_experts

    def _dense_mlp_extra(self) -> int:
        """What the dense layers' own MLP width adds over the dense config's d_ff."""
        c = self.dense
        if not self.dense_layers or self.dense_d_ff is None:
            return 0
        return self.dense_layers * 3 * c.d_model * (self.dense_d_ff - c.d_ff)

    def _with_mlps(self, n_mlps: int) -> int:
        c = self.dense
        return (c.num_params()
                + self.moe_layers * (n_mlps + self.n_shared - 1) * c.mlp_params_per_layer()
                + self._dense_mlp_extra() + self.router_params())

    def total_params(self) -> int:
        """Every parameter: what the weights occupy in memory."""
        return self._with_mlps(self.n_experts)

    def active_params(self) -> int:
        """Parameters one token meets: k experts per layer, attention, router, embedding,
        norms and head."""
        return self._with_mlps(self.top_k)

    def active_matmul_params(self) -> int:
        """Active parameters that take part in a matmul (not the embedding lookup or the
        norms): 2 x this is the forward FLOPs per token of the weight matmuls."""
        c = self.dense
        return (c.matmul_params()
                + self.moe_layers * (self.top_k + self.n_shared - 1)
                * c.mlp_params_per_layer() + self._dense_mlp_extra() + self.router_params())

    def training_flops(self, tokens: float) -> float:
        """6 x active parameters x tokens (the 6 N N_tok rule with the active count)."""
        return 6 * self.active_params() * _check_tokens("tokens", tokens)

    def weight_bytes(self, bytes_per_element: float = 2) -> float:
        """Bytes of all parameters (every expert is stored)."""
        return _exact(self.total_params() * check_positive("bytes_per_element",
                                                           bytes_per_element))

    def all_to_all_bytes_per_token(self, bytes_per_element: float = 2) -> float:
        """Bytes one token sends in ONE of an MoE layer's two all-to-alls (dispatch to its
        experts, combine back): its k copies of [D] activations, k D s, when all of them
        leave its chip (scalebook.parallelism.moe_all_to_all_bytes keeps the (n-1)/n of them
        that leave one of n chips; 1/n stay home)."""
        s = check_positive("bytes_per_element", bytes_per_element)
        return _exact(self.top_k * self.dense.d_model * s)


# Mixtral 8x7B (arXiv:2401.04088, Table 1): dim 4096, 32 layers, head_dim 128, hidden
# 14336, 32 heads, 8 KV heads, vocabulary 32000, 8 experts, top 2; untied head.
MIXTRAL_8X7B = MoEConfig(
    TransformerConfig("mixtral-8x7b", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
                      head_dim=128, d_ff=14336, vocab_size=32000, rope_theta=1e6,
                      max_context=32768),
    n_experts=8, top_k=2)


# DeepSeek-V3 (arXiv:2412.19437, §2 and §4.2): 61 layers, D 7168, the first 3 dense (MLP
# width 18432), the rest 256 routed experts of width 2048 plus 1 shared, top 8; vocabulary
# 129,280, untied head. Its attention is multi-head latent attention (MLA), which
# TransformerConfig does not describe; this stand-in is grouped-query attention with the
# same parameters per layer (128 heads of 96, 8 KV heads: 187.2M against MLA's 187.1M), so
# the totals are DeepSeek's 671B and 37B, but the attention's score and value FLOPs per key
# are 4 x 128 x 96 where MLA's are 2 x 128 x (192 + 128) (see chapter 6). The
# multi-token-prediction module (14B) is left out, as in the 671B.
DEEPSEEK_V3 = MoEConfig(
    TransformerConfig("deepseek-v3-gqa", n_layers=61, d_model=7168, n_heads=128,
                      n_kv_heads=8, head_dim=96, d_ff=2048, vocab_size=129280,
                      max_context=131072),
    n_experts=256, top_k=8, n_shared=1, dense_layers=3, dense_d_ff=18432)


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (MLA; DeepSeek-V2, arXiv:2405.04434, and DeepSeek-V3,
    arXiv:2412.19437, section 2.1.1), one layer's shapes and what its cache costs.

    Per token each layer caches a latent c = x W_DKV of ``kv_rank`` (d_c) values and one
    rotary key of ``rope_dim`` (d_r) values shared by all heads: (d_c + d_r) L s bytes per
    token. Each of the H heads gets its key (``nope_dim`` d_n from the latent, plus the
    shared rotary part) and value (``v_dim`` d_v) from the latent by up-projections W_UK
    [d_c, H d_n] and W_UV [d_c, H d_v]; the query comes from its own latent of ``q_rank``
    values (None: straight from x). At decode the up-projections can be *absorbed*: the
    query is multiplied by W_UK once (q W_UK^T, d_c values per head), scores are taken
    against the cached latents directly, and W_UV is applied to the weighted sum of
    latents, so the cache is never expanded.

    Per key and query, one layer: absorbed, 2 H (d_c + d_r) FLOPs for the scores and 2 H d_c
    for the values; unabsorbed (keys and values expanded), 2 H (d_n + d_r) and 2 H d_v, plus
    expanding each key, 2 d_c H (d_n + d_v), unless the expanded keys and values are cached
    instead (H (d_n + d_r + d_v) values per token and layer, what ``mha_cache_bytes_per_token``
    counts)."""

    d_model: int
    n_heads: int
    kv_rank: int
    rope_dim: int
    nope_dim: int
    v_dim: int
    n_layers: int
    q_rank: int | None = None

    def __post_init__(self):
        for f in ("d_model", "n_heads", "kv_rank", "rope_dim", "nope_dim", "v_dim",
                  "n_layers"):
            check_positive_int(f, getattr(self, f))
        if self.q_rank is not None:
            check_positive_int("q_rank", self.q_rank)

    @property
    def qk_dim(self) -> int:
        """A head's query and key width: d_n + d_r."""
        return self.nope_dim + self.rope_dim

    def params_per_layer(self) -> int:
        """Weights of one layer's attention: the query path (D d_q + d_q H (d_n + d_r), or
        D H (d_n + d_r) without a query latent), W_DKV [D, d_c + d_r], W_UK and W_UV
        [d_c, H d_n] and [d_c, H d_v], W_O [H d_v, D], and the RMSNorm scales of the
        latents (d_q + d_c)."""
        D, H, dc = self.d_model, self.n_heads, self.kv_rank
        q = (D * H * self.qk_dim if self.q_rank is None
             else D * self.q_rank + self.q_rank * H * self.qk_dim + self.q_rank)
        kv = D * (dc + self.rope_dim) + dc * H * (self.nope_dim + self.v_dim) + dc
        return q + kv + H * self.v_dim * D

    def cache_values_per_token(self) -> int:
        """Values one token leaves in the cache: (d_c + d_r) L."""
        return (self.kv_rank + self.rope_dim) * self.n_layers

    def kv_cache_bytes_per_token(self, bytes_per_element: float = 2) -> float:
        """(d_c + d_r) L s bytes: the latent and the shared rotary key, every layer."""
        s = check_positive("bytes_per_element", bytes_per_element)
        return _exact(self.cache_values_per_token() * s)

    def mha_cache_bytes_per_token(self, bytes_per_element: float = 2) -> float:
        """The cache if the expanded keys and values were stored, as multi-head attention
        with these heads does: H (d_n + d_r + d_v) L s bytes."""
        s = check_positive("bytes_per_element", bytes_per_element)
        return _exact(self.n_heads * (self.qk_dim + self.v_dim) * self.n_layers * s)

    def flops_per_key(self, absorbed: bool = True) -> int:
        """Attention FLOPs of one layer per key, per query token: absorbed,
        2 H (d_c + d_r) + 2 H d_c; not absorbed, 2 H (d_n + d_r) + 2 H d_v (keys and values
        already expanded)."""
        H = self.n_heads
        if absorbed:
            return 2 * H * (self.kv_rank + self.rope_dim) + 2 * H * self.kv_rank
        return 2 * H * self.qk_dim + 2 * H * self.v_dim

    def attention_flops_per_token(self, seq_len: int, causal: bool = True,
                                  absorbed: bool = False) -> float:
        """Forward FLOPs per token of the score and value matmuls over all layers:
        L x ``flops_per_key(absorbed)`` x keys, with (S + 1) / 2 keys per token on average
        when ``causal`` (as :meth:`scalebook.models.TransformerConfig.attention_flops_per_token`). Training
        and prefill run the unabsorbed form (keys and values expanded once per token)."""
        S = _check_seq_len(seq_len)
        keys = (S + 1) / 2 if causal else S
        return self.n_layers * self.flops_per_key(absorbed) * keys

    def expand_flops_per_key(self) -> int:
        """FLOPs to expand one cached latent into its keys and values, one layer:
        2 d_c H (d_n + d_v), what an unabsorbed decode step pays for every key it reads."""
        return 2 * self.kv_rank * self.n_heads * (self.nope_dim + self.v_dim)

    def absorb_flops_per_query(self) -> int:
        """What absorbing costs per query token and layer: the query through W_UK^T,
        2 H d_n d_c, and the weighted latent through W_UV, 2 H d_c d_v (independent of the
        context)."""
        return 2 * self.n_heads * self.kv_rank * (self.nope_dim + self.v_dim)

    def decode_intensity(self, absorbed: bool = True, queries: int = 1,
                         bytes_per_element: float = 2) -> float:
        """Arithmetic intensity of decode attention over a long context, FLOPs per byte of
        cache read, ``queries`` (q) query tokens per sequence sharing the cache: absorbed,
        q [2 H (d_c + d_r) + 2 H d_c] / ((d_c + d_r) s), all heads reading the one latent;
        not absorbed, with the expanded keys and values cached, q 2 H (d_n + d_r + d_v) /
        (H (d_n + d_r + d_v) s) = 2 q / s, multi-head attention's."""
        q = check_positive_int("queries", queries)
        s = check_positive("bytes_per_element", bytes_per_element)
        if absorbed:
            return q * self.flops_per_key(True) / ((self.kv_rank + self.rope_dim) * s)
        return (q * self.flops_per_key(False)
                / (self.n_heads * (self.qk_dim + self.v_dim) * s))


# DeepSeek-V3's attention (arXiv:2412.19437, section 4.2): 128 heads, d_c = 512, query
# latent 1,536, per-head key width 128 + a shared 64-wide rotary key, value width 128;
# 61 layers, D = 7,168.
DEEPSEEK_V3_MLA = MLAConfig(d_model=7168, n_heads=128, kv_rank=512, rope_dim=64,
                            nope_dim=128, v_dim=128, n_layers=61, q_rank=1536)


_MODELS = {
    "llama3-8b": TransformerConfig("llama3-8b", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
                                   head_dim=128, d_ff=14336, vocab_size=128256,
                                   max_context=LLAMA31_CONTEXT),
    "llama3-70b": TransformerConfig("llama3-70b", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8,
                                    head_dim=128, d_ff=28672, vocab_size=128256,
                                   max_context=LLAMA31_CONTEXT),
    "llama3-405b": TransformerConfig("llama3-405b", n_layers=126, d_model=16384, n_heads=128,
                                     n_kv_heads=8, head_dim=128, d_ff=53248, vocab_size=128256,
                                   max_context=LLAMA31_CONTEXT),
}


def model_names() -> list[str]:
    return list(_MODELS)


def get_model(name) -> TransformerConfig:
    """One of "llama3-8b", "llama3-70b", "llama3-405b" (a config passes through)."""
    if isinstance(name, TransformerConfig):
        return name
    if not isinstance(name, str):
        raise UnknownNameError(f"unknown model {name!r}; known models: {', '.join(_MODELS)}")
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-").replace("llama-3", "llama3")
    if key not in _MODELS:
        raise UnknownNameError(f"unknown model {name!r}; known models: {', '.join(_MODELS)}")
    return _MODELS[key]
