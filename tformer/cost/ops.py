"""The Op record: one row of the ledger, and the cost of the primitive computations it is made of.

An op is named like the module that runs it ("decoder.layers.3.attn.q_proj"), or like the step
inside a module that has no module of its own ("decoder.layers.3.attn.scores"), so a measured
profile lines up with the prediction row by row.

FLOPs: 2 per multiply-accumulate. ``matmul_flops`` is what torch's FlopCounterMode counts (mm,
addmm, bmm: the bias add of addmm is not counted); everything element-wise (bias adds, norms,
softmax, activations, residual adds, optimizer updates) goes to ``other_flops``, by the
per-element counts below. Those counts are conventions, stated here once; they are not measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

# The fixed vocabulary of op kinds (a profile's rows are grouped by these).
KINDS = (
    "embedding", "position", "norm", "qkv_proj", "rope", "scores", "softmax", "context", "out_proj",
    "ffn_up", "ffn_gate", "activation", "ffn_down", "residual", "pooler", "lm_head", "loss", "optimizer",
    "rnn_input", "rnn_hidden", "rnn_gates",  # a recurrent layer: all tokens' input projection, per-step parts
    "rnn_bridge", "rnn_attention",  # rnn-seq2seq: a bidirectional encoder's bridge; the decoder's attention
    "patch_embed", "classifier",  # vit: patches -> d_model (a strided convolution); [CLS] -> classes
    "projection", "similarity", "temperature",  # clip: into the shared space; every image x every text; x exp(scale)
)
PHASES = ("forward", "recompute", "backward", "optimizer")

# Element-wise FLOPs per element (conventions; FlopCounterMode counts none of these).
LAYERNORM_FLOPS_PER_ELEMENT = 7  # mean (1), subtract (1), square (1), sum (1), normalise (1), scale (1), shift (1)
RMSNORM_FLOPS_PER_ELEMENT = 4  # square (1), sum (1), multiply by rsqrt (1), scale (1)
SOFTMAX_FLOPS_PER_ELEMENT = 5  # max (1), subtract (1), exp (1), sum (1), divide (1)
ACTIVATION_FLOPS_PER_ELEMENT = {"relu": 1, "gelu": 8, "gelu_tanh": 8, "silu": 4, "quick_gelu": 5}
ROPE_FLOPS_PER_ELEMENT = 3  # x*cos + rotate(x)*sin
CROSS_ENTROPY_FLOPS_PER_LOGIT = 6  # log-softmax (5) + pick and average (1)
BACKWARD_OTHER_FACTOR = 2  # element-wise backward ~ twice the forward element-wise work (a convention)


class MatMul(NamedTuple):
    """A product's sizes as data: ``batch`` independent (m x k) @ (k x n) products.

    ``weight``: the right operand is a 2-D weight (nn.Linear, whose leading dims are flattened
    into m), not a batched activation (attention's bmm over heads).
    """

    batch: int
    m: int
    k: int
    n: int
    weight: bool = False

    @property
    def flops(self) -> int:
        return matmul_flops(self.m, self.k, self.n, batch=self.batch)


@dataclass
class Op:
    """One computation of a forward pass, a backward pass or an optimizer step.

    ``params`` are the parameters this op owns (each tensor counted once over the whole list,
    so a tied LM head owns none); ``saved_bytes`` is what autograd keeps from this op for the
    backward pass (training only). Bytes are exact integers.
    """

    name: str
    kind: str
    layer: int | None
    phase: str
    shapes: str
    matmul_flops: int = 0
    other_flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    params: int = 0
    embedding_params: int = 0  # the part of ``params`` that is an embedding/position table
    saved_bytes: int = 0
    scores_bytes: int = 0  # the part of ``saved_bytes`` that is an s x s tensor (gone with a fused kernel)
    weight_bytes: int = 0  # the part of ``bytes_read`` that is parameters
    weight_layout: str = ""  # a weight product's block layout (config.quantize's names: q4_1, q8_0, ...); "": float
    # The weight bytes of the one block-kernel product this op runs in with the Linears that read its input (q, k, v;
    # gate, up: tformer.model.stacked_products), so the roofline charges that call's fixed cost once; 0: alone.
    stack_bytes: int = 0
    cache_bytes: int = 0  # KV-cache bytes this op's layer holds after the step (scores: K, context: V)
    stack: str = ""  # "encoder" | "decoder" | "" (model-level)
    dims: MatMul | None = None  # a matmul's sizes (the roofline reads these; ``shapes`` is only a label)
    # Backward matmul FLOPs when not 2x forward (the gradients of both operands): a fixed random matrix
    # needs only its input's gradient (1x), a hash that argmax cuts from the graph none (0).
    backward_matmul_flops: int | None = None

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.other_flops

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity in FLOP/byte (None for an op that moves no bytes)."""
        return self.flops / self.bytes if self.bytes else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dims"] = self.dims._asdict() if self.dims else None
        d.update(flops=self.flops, bytes=self.bytes, intensity=self.intensity)
        return d


# Primitive costs ---------------------------------------------------------------------------
# The ledger builds every op from these, and the textbook's formula-level cases call them
# directly, so a formula in a test and a row in the ledger are the same code.


def matmul_flops(m: int, k: int, n: int, batch: int = 1, flop_per_mac: int = 2) -> int:
    """(m x k) @ (k x n), ``batch`` times: m*k*n multiply-accumulates, 2 FLOPs each by default."""
    return flop_per_mac * batch * m * k * n


def matmul_bytes(m: int, k: int, n: int, bytes_per: int, batch: int = 1, weight_bytes_per: int | None = None) -> int:
    """Read A (m x k) and B (k x n), write C (m x n); B may be a weight in another dtype."""
    wb = bytes_per if weight_bytes_per is None else weight_bytes_per
    return batch * (m * k * bytes_per + k * n * wb + m * n * bytes_per)


def matmul_intensity(m: int, k: int, n: int, bytes_per: int, batch: int = 1) -> float:
    """FLOP/byte of a matmul that reads both operands and writes the result once."""
    return matmul_flops(m, k, n, batch) / matmul_bytes(m, k, n, bytes_per, batch)


def linear_params(d_in: int, d_out: int, bias: bool) -> int:
    return d_in * d_out + (d_out if bias else 0)


def norm_params(d: int, norm: str) -> int:
    """LayerNorm has a scale and a shift per feature; RMSNorm only a scale."""
    return 2 * d if norm == "layernorm" else d


def norm_flops(elements: int, norm: str = "layernorm", flops_per_element: int | None = None) -> int:
    if flops_per_element is None:
        flops_per_element = LAYERNORM_FLOPS_PER_ELEMENT if norm == "layernorm" else RMSNORM_FLOPS_PER_ELEMENT
    return elements * flops_per_element


def attention_scores_cost(batch: int, heads: int, n_q: int, n_k: int, d_k: int, bytes_per: int,
                          kv_heads: int | None = None) -> tuple[int, int, int]:
    """Q K^T for every head: (FLOPs, bytes read (Q, K), bytes written (the n_q x n_k scores)).

    K is read once per key/value head: grouped-query attention shares it across a group.
    """
    kv = heads if kv_heads is None else kv_heads
    flops = matmul_flops(n_q, d_k, n_k, batch=batch * heads)
    read = batch * (heads * n_q * d_k + kv * n_k * d_k) * bytes_per
    written = batch * heads * n_q * n_k * bytes_per
    return flops, read, written


def elementwise_intensity(flops_per_element: float, bytes_per: int, tensors_read: int = 1, tensors_written: int = 1) -> float:
    """FLOP/byte of an element-wise op (ReLU: 1 FLOP per element, read one, write one)."""
    return flops_per_element / ((tensors_read + tensors_written) * bytes_per)


def kv_cache_bytes(layers: int, tokens: int, kv_heads: int, head_dim: int, batch: int, bytes_per: int) -> int:
    """Keys and values: 2 x layers x tokens x kv_heads x head_dim x batch x bytes (bytes_per=1: elements)."""
    return 2 * layers * tokens * kv_heads * head_dim * batch * bytes_per


def matmul_label(a: tuple[int, ...], b: tuple[int, ...]) -> str:
    """The display text of a product of operands shaped ``a`` and ``b``: "[m, k] @ [k, n]"."""
    return f"[{', '.join(map(str, a))}] @ [{', '.join(map(str, b))}]"
