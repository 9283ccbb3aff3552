"""The parts an architecture description is made of (plain frozen dataclasses: no torch, no costs): Linear,
Norm, Table, Weights, Positions, Attention, MLP, Layer, the recurrent parts, Patches, Stack, the heads and
Architecture, each naming its module path and sized by tuples, each listing its parameters in the model's
registration order. tformer.cost.architecture builds them from a config.

Shapes follow PyTorch: a Linear's weight is (out, in).
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.core.errors import TformerError
from tformer.cost.recurrent import GATES


@dataclass(frozen=True)
class Linear:
    """y = x W^T (+ b): one nn.Linear. ``tied``: W is the token table's (the module owns only its bias).
    ``layout`` (config.quantize's names: int8, int4, q8_0, q4_1, q5_0, q4_k, q6_k): W is weight-only quantized to ``bits`` per weight,
    held in buffers (tformer.cost.quantized: their names, shapes, bytes)."""

    path: str
    kind: str  # the ledger's op kind: qkv_proj, out_proj, ffn_up, ffn_gate, ffn_down, pooler, lm_head
    d_in: int
    d_out: int
    bias: bool
    tied: bool = False
    bits: int = 0  # 0: float W (the workload's dtype)
    group: int = 0  # int4: inputs per scale and zero; a GGUF block format: weights per block
    layout: str = ""  # "": float W

    def parameters(self) -> dict[str, tuple[int, ...]]:
        out = {} if self.tied or self.layout else {f"{self.path}.weight": (self.d_out, self.d_in)}
        if self.bias:
            out[f"{self.path}.bias"] = (self.d_out,)
        return out


@dataclass(frozen=True)
class Norm:
    """LayerNorm (scale and shift per feature) or RMSNorm (scale only; rmsnorm_offset: scale 1 + w) over the last
    dimension."""

    path: str
    d: int
    kind: str  # layernorm | rmsnorm | rmsnorm_offset
    eps: float

    def parameters(self) -> dict[str, tuple[int, ...]]:
        out = {f"{self.path}.weight": (self.d,)}
        if self.kind == "layernorm":
            out[f"{self.path}.bias"] = (self.d,)
        return out


@dataclass(frozen=True)
class Table:
    """A lookup table of ``shape`` (rows, width). ``trained``: a parameter; else a fixed buffer. ``layout``: the
    token table of a tied LM head kept in a GGUF block format (tformer.cost.quantized): no weight of its own, its
    rows are read from the head's blocks, as llama.cpp reads token_embd."""

    path: str
    shape: tuple[int, int]
    trained: bool = True
    layout: str = ""

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return {f"{self.path}.weight": self.shape} if self.trained and not self.layout else {}


@dataclass(frozen=True)
class Weights:
    """One bare parameter tensor of a module that is no Linear, norm or table (Linformer's E and F)."""

    path: str
    shape: tuple[int, ...]

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return {self.path: self.shape}


@dataclass(frozen=True)
class Positions:
    """How a stack knows token order. ``kind``: learned | sinusoidal (a table added to the
    embeddings), alibi | relative (a (1, H, Tq, Tk) bias on every layer's scores), rope (q and k
    rotated inside attention), none. ``table`` is None where nothing is looked up."""

    kind: str
    path: str | None = None
    table: Table | None = None
    offset: int = 0  # learned: ids are shifted by this many rows (BART reserves 2)

    @property
    def added(self) -> bool:
        return self.kind in ("learned", "sinusoidal")

    @property
    def score_bias(self) -> bool:
        return self.kind in ("alibi", "relative")


@dataclass(frozen=True)
class Attention:
    """Project to heads, attend, project back. Rows that have no module of their own (rope,
    scores, softmax, context, residual) are named ``path + "." + step``."""

    path: str
    norm: Norm
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    heads: int
    kv_heads: int
    head_dim: int
    cross: bool
    rope: bool  # q and k are rotated (self-attention of a rope stack)
    kind_weights: tuple[Weights, ...] = ()  # the attention kind's own parameters (path.attend.*), if any
    q_norm: Norm | None = None  # over each head's query (head_dim), before RoPE (Gemma 3)
    k_norm: Norm | None = None  # ... and each head's key
    post_norm: Norm | None = None  # sandwich placement: on the output, before the residual add (the block's)

    def linears(self) -> tuple[Linear, ...]:
        return self.q, self.k, self.v, self.o

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return _merge(self.norm, *self.linears(), self.q_norm, self.k_norm, *self.kind_weights, self.post_norm)


@dataclass(frozen=True)
class MLP:
    """down(act(up(x))), or down(act(gate(x)) * up(x)) when ``gate`` is set."""

    path: str
    norm: Norm
    up: Linear
    gate: Linear | None
    down: Linear
    activation: str
    post_norm: Norm | None = None  # sandwich placement: on the output, before the residual add (the block's)

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return _merge(self.norm, self.up, self.gate, self.down, self.post_norm)


@dataclass(frozen=True)
class Layer:
    index: int
    path: str
    attention: tuple[Attention, ...]  # self-attention, then cross-attention where the stack has it
    mlp: MLP

    def parameters(self) -> dict[str, tuple[int, ...]]:
        # The model registers modules in block order: attn_norm, attn, cross_attn_norm, cross_attn, ...
        return _merge(*self.attention, self.mlp)


@dataclass(frozen=True)
class Recurrent:
    """One recurrent layer (arch='rnn'), both directions where bidirectional, inside the torch module at
    ``path`` (nn.LSTM / GRU / RNN and tformer.model.rnn), with torch's parameter names."""

    index: int
    path: str
    cell: str  # lstm | gru | rnn
    d_in: int
    d_hidden: int
    bias: bool
    directions: int = 1
    state_grad: bool = False  # the initial state takes a gradient (a decoder's, from the encoder), not zeros

    attention = ()  # no attention: walkers of ``layer.attention`` find none

    @property
    def gates(self) -> int:
        return GATES[self.cell]

    def suffix(self, direction: int) -> str:
        return f"_l{self.index}" + ("_reverse" if direction else "")

    def parameters(self) -> dict[str, tuple[int, ...]]:
        g, h, out = self.gates, self.d_hidden, {}
        for direction in range(self.directions):
            sfx = f"{self.path}.{{}}{self.suffix(direction)}"
            out[sfx.format("weight_ih")] = (g * h, self.d_in)
            out[sfx.format("weight_hh")] = (g * h, h)
            if self.bias:
                out[sfx.format("bias_ih")] = (g * h,)
                out[sfx.format("bias_hh")] = (g * h,)
        return out


@dataclass(frozen=True)
class Bridge:
    """arch='rnn-seq2seq' with a bidirectional encoder: Linears from its 2h-wide outputs (``memory``, every
    source position; none without attention, which never reads them) and final states (``state``: each
    layer's h, and c for an LSTM) to the decoder's h."""

    index: int  # the encoder's last layer (where a layout places it)
    memory: Linear | None
    state: Linear
    states: int  # state tensors per layer: 2 for an LSTM (h, c), else 1
    layers: int

    attention = ()

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return _merge(self.memory, self.state)


@dataclass(frozen=True)
class RecurrentAttention:
    """arch='rnn-seq2seq': the decoder's attention over the encoder's outputs (tformer.model.rnn_seq2seq).
    bahdanau: keys W_h (once per source), query W_s, score v; luong-general: keys W_a (once per source);
    luong-*: combine W_c (the attentional vector); luong-dot: no weights in the score."""

    index: int  # the decoder's last layer
    path: str
    kind: str  # bahdanau | luong-dot | luong-general
    d_hidden: int
    keys: Linear | None
    query: Linear | None
    score: Linear | None
    combine: Linear | None

    attention = ()

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return _merge(self.keys, self.query, self.score, self.combine)


@dataclass(frozen=True)
class Patches:
    """An image (B, C, H, W) cut into grid x grid patches of P x P pixels, each projected to d (a Conv2d with
    kernel and stride P: the same as unfolding the patches into rows of C P^2 values and one Linear), then
    the learned [CLS] vector put in front: (B, grid^2 + 1, d). Module ``path``: ``cls_token`` (d,), then
    ``proj`` (the convolution)."""

    path: str
    channels: int
    patch: int
    grid: int  # patches per side: image_size / patch_size
    d: int
    bias: bool

    @property
    def tokens(self) -> int:
        return self.grid * self.grid + 1

    @property
    def linear(self) -> Linear:
        """The projection as the Linear it equals: C P^2 pixel values in, d out."""
        return Linear(f"{self.path}.proj", "patch_embed", self.channels * self.patch * self.patch, self.d, self.bias)

    def parameters(self) -> dict[str, tuple[int, ...]]:
        out = {f"{self.path}.cls_token": (self.d,), f"{self.path}.proj.weight": (self.d, self.channels, self.patch,
                                                                                 self.patch)}
        if self.bias:
            out[f"{self.path}.proj.bias"] = (self.d,)
        return out


@dataclass(frozen=True)
class Stack:
    """Embedding lookups (or an image's patches), positions, embedding norm, N blocks, final norm.

    ``tables``: the token table, then any table added to it (BERT's segments); the token table is
    the model's one table, shared by every stack that looks it up. A stack over ``patches`` has no
    tables and a fixed number of tokens (``patches.tokens``), whatever the workload's seq."""

    name: str  # encoder | decoder | vision | text: the module path of the stack
    causal: bool
    cross: bool  # every layer also attends to the encoder's output
    tables: tuple[Table, ...]
    positions: Positions
    embed_norm: Norm | None
    layers: tuple[Layer, ...]  # one per depth; shared layers (ALBERT) repeat one path, counted once
    final_norm: Norm | None
    embed_proj: Linear | None = None  # ALBERT: embeddings of width E -> d_model, before the first layer
    patches: Patches | None = None  # vit, clip's vision tower: the image's patch embedding, first in the stack
    pool_norm: Norm | None = None  # clip: a norm over the pooled vector only ([CLS]), after the layers

    def parameters(self) -> dict[str, tuple[int, ...]]:
        table = self.positions.table
        return _merge(self.patches, table, self.embed_norm, self.embed_proj, *self.layers, self.final_norm,
                      self.pool_norm)


@dataclass(frozen=True)
class Contrastive:
    """CLIP's head (module ``path``): each tower's pooled vector projected into the shared space (no bias), both
    L2-normalised, every image against every text: an N x N similarity times exp(logit_scale), the learned
    temperature, scored by cross-entropy both ways (symmetric InfoNCE)."""

    path: str
    vision_proj: Linear
    text_proj: Linear

    @property
    def logit_scale(self) -> str:
        return f"{self.path}.logit_scale"

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return {self.logit_scale: (), **_merge(self.vision_proj, self.text_proj)}


@dataclass(frozen=True)
class MLMHead:
    """BERT's masked-token head: dense, activation, norm, then the (tied) output projection."""

    path: str
    dense: Linear
    activation: str
    norm: Norm
    decoder: Linear

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return _merge(self.dense, self.norm, self.decoder)


@dataclass(frozen=True)
class LMHead:
    """Hidden states to logits. ``rescale``: hidden * d_model^-0.5 first (T5's tied head);
    ``logits_bias``: a fixed bias buffer added to the logits (BART); ``softcap``: logits squashed by
    cap * tanh(logits / cap) (Gemma 2)."""

    linear: Linear
    rescale: bool = False
    logits_bias: bool = False
    softcap: bool = False

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return self.linear.parameters()


@dataclass(frozen=True)
class Architecture:
    """A whole model: the stacks in the order they run, then the heads on the last stack's output."""

    arch: str
    tok_embed: Table | None  # None: the model reads no tokens (vit)
    type_embed: Table | None
    stacks: tuple[Stack, ...]
    pooler: Linear | None = None  # first token -> dense -> tanh
    mlm_head: MLMHead | None = None
    lm_head: LMHead | None = None
    pair_head: Linear | None = None  # the pooler's output -> 2 classes (NSP, SOP)
    classifier: Linear | None = None  # vit: the [CLS] state -> n_classes; a task head (below): its output layer
    contrastive: Contrastive | None = None  # clip: projections, similarity, temperature
    # A task head in place of the LM head (config.task): sequence-classification reads one pooled vector per
    # sequence; token-classification and question-answering (2 outputs: start, end) read every token.
    task: str = ""
    pooling: str | None = None  # sequence-classification: cls | mean | last

    def stack(self, name: str) -> Stack:
        for st in self.stacks:
            if st.name == name:
                return st
        raise TformerError(f"a {self.arch} model has no {name} stack; it has: {', '.join(s.name for s in self.stacks)}")

    @property
    def loss_skips(self) -> tuple[str, ...]:
        """Name prefixes of the parameters a training loss never reaches: BERT's pooler when the
        masked-token head gives the loss (the pooler's output is returned, but nothing scores it).
        They run forward, get no gradient and no optimizer state. A pair head (NSP / SOP) is there to be
        trained: its loss (mlm+nsp, mlm+sop) reaches the pooler and the head, so nothing is skipped."""
        if self.pooler is None or self.pair_head is not None:
            return ()
        if self.task:  # a task head reads the pooler only when it classifies the pooled first token
            reads = self.task == "sequence-classification" and self.pooling == "cls"
        else:
            reads = self.mlm_head is None  # features only: the pooler's output is what the model gives
        return () if reads else (self.pooler.path.split(".")[0] + ".",)

    def parameters(self) -> dict[str, tuple[int, ...]]:
        """Every parameter once (a tied weight under its first owner), in the model's registration order."""
        return _merge(self.tok_embed, self.type_embed, *self.stacks, self.pooler, self.mlm_head, self.lm_head,
                      self.pair_head, self.classifier, self.contrastive)


def _merge(*parts) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for part in parts:
        if part is not None:
            out.update(part.parameters())
    return out


__all__ = ["Linear", "Norm", "Table", "Weights", "Positions", "Attention", "MLP", "Layer", "Recurrent", "Bridge", "RecurrentAttention", "Patches", "Stack", "Contrastive", "MLMHead", "LMHead", "Architecture"]
