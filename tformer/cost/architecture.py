"""One description of each architecture: its stacks, its blocks in the order they run, each block
named by the model's module path and sized by tuples.

The model builds its modules from it (tformer.model) and the ledger walks it (tformer.cost.oplist),
so the two cannot drift: tests hold ``describe(config).parameters()`` equal to the names and shapes
of ``model.named_parameters()``. Adding an architecture is one branch of ``describe`` (the only
place that dispatches on ``config.arch``), one model file and one runner.

Plain data: no torch, no costs. Shapes follow PyTorch: a Linear's weight is (out, in).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tformer.core.config import BLOCK_GROUPS, QUANT_BITS, QUANT_GROUPS
from tformer.core.errors import TformerError
from tformer.cost.recurrent import GATES


@dataclass(frozen=True)
class Linear:
    """y = x W^T (+ b): one nn.Linear. ``tied``: W is the token table's (the module owns only its bias).
    ``layout`` (config.quantize's names: int8, int4, q8_0, q4_1): W is weight-only quantized to ``bits`` per weight,
    held in buffers (tformer.cost.quantized: their names, shapes, bytes)."""

    path: str
    kind: str  # the ledger's op kind: qkv_proj, out_proj, ffn_up, ffn_gate, ffn_down, pooler, lm_head
    d_in: int
    d_out: int
    bias: bool
    tied: bool = False
    bits: int = 0  # 0: float W (the workload's dtype)
    group: int = 0  # int4, q8_0, q4_1: inputs per scale (and zero)
    layout: str = ""  # "": float W

    def parameters(self) -> dict[str, tuple[int, ...]]:
        out = {} if self.tied or self.layout else {f"{self.path}.weight": (self.d_out, self.d_in)}
        if self.bias:
            out[f"{self.path}.bias"] = (self.d_out,)
        return out


@dataclass(frozen=True)
class Norm:
    """LayerNorm (scale and shift per feature) or RMSNorm (scale only) over the last dimension."""

    path: str
    d: int
    kind: str  # layernorm | rmsnorm
    eps: float

    def parameters(self) -> dict[str, tuple[int, ...]]:
        out = {f"{self.path}.weight": (self.d,)}
        if self.kind == "layernorm":
            out[f"{self.path}.bias"] = (self.d,)
        return out


@dataclass(frozen=True)
class Table:
    """A lookup table of ``shape`` (rows, width). ``trained``: a parameter; else a fixed buffer."""

    path: str
    shape: tuple[int, int]
    trained: bool = True

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return {f"{self.path}.weight": self.shape} if self.trained else {}


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

    def linears(self) -> tuple[Linear, ...]:
        return self.q, self.k, self.v, self.o

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return _merge(self.norm, *self.linears(), *self.kind_weights)


@dataclass(frozen=True)
class MLP:
    """down(act(up(x))), or down(act(gate(x)) * up(x)) when ``gate`` is set."""

    path: str
    norm: Norm
    up: Linear
    gate: Linear | None
    down: Linear
    activation: str

    def parameters(self) -> dict[str, tuple[int, ...]]:
        return _merge(self.norm, self.up, self.gate, self.down)


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
    ``logits_bias``: a fixed bias buffer added to the logits (BART)."""

    linear: Linear
    rescale: bool = False
    logits_bias: bool = False

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


# Building the description from a config ------------------------------------------------------
def describe(config) -> Architecture:
    """The description of ``config``'s model, its Linears quantized where config.quantize says so."""
    arch = _describe(config)
    return arch if config.quantize == config.quantize_head == "none" else _quantized(config, arch)


def _describe(config) -> Architecture:
    """The float description: the one place that dispatches on ``config.arch``."""
    c = config
    tok = Table("tok_embed", (c.vocab_size, c.d_model))
    if c.arch == "decoder":
        return Architecture(c.arch, tok, None, (_stack(c, "decoder", c.n_layers, (tok,), causal=True),),
                            lm_head=None if c.task else _lm_head(c), **_task_head(c, bias=False))
    if c.arch == "encoder":
        d, e = c.d_model, c.embed_dim or c.d_model  # e: the tables' width (ALBERT's E)
        tok = Table("tok_embed", (c.vocab_size, e))
        segments = Table("type_embed", (c.type_vocab_size, e)) if c.type_vocab_size else None
        tables = (tok, segments) if segments else (tok,)
        mlm = None
        if c.lm_head and not c.task:  # ALBERT's head maps back to E, where the tied token table lives
            mlm = MLMHead("mlm_head", Linear("mlm_head.dense", "lm_head", d, e, c.bias), c.activation,
                          _norm(c, "mlm_head.norm", e),
                          Linear("mlm_head.decoder", "lm_head", e, c.vocab_size, c.bias, tied=c.tied_embeddings))
        pooler = Linear("pooler.dense", "pooler", d, d, c.bias) if c.pooler else None
        pair = Linear("pair_head", "pooler", d, 2, c.bias) if c.pair_head else None
        stack = _stack(c, "encoder", c.n_layers, tables, causal=False, width=c.embed_dim, shared=c.share_layers)
        return Architecture(c.arch, tok, segments, (stack,), pooler=pooler, mlm_head=mlm, pair_head=pair,
                            **_task_head(c, bias=True))
    if c.arch == "encoder-decoder":
        stacks = (_stack(c, "encoder", c.n_layers, (tok,), causal=False),
                  _stack(c, "decoder", c.n_decoder_layers, (tok,), causal=True, cross=True))
        return Architecture(c.arch, tok, None, stacks,
                            lm_head=_lm_head(c, rescale=c.rescale_tied_head, logits_bias=c.final_logits_bias))
    if c.arch == "rnn":
        return _rnn(c, tok)
    if c.arch == "rnn-seq2seq":
        return _rnn_seq2seq(c, tok)
    if c.arch == "vit":
        head = Linear("head", "classifier", c.d_model, c.n_classes, True) if c.n_classes else None
        return Architecture(c.arch, None, None, (_vision_stack(c, "encoder"),), classifier=head)
    if c.arch == "clip":
        vision = c.vision_tower()
        stacks = (_vision_stack(vision, "vision", pool_norm=True), _stack(c, "text", c.n_layers, (tok,), causal=True))
        head = Contrastive("head", Linear("head.vision_proj", "projection", vision.d_model, c.projection_dim, False),
                           Linear("head.text_proj", "projection", c.d_model, c.projection_dim, False))
        return Architecture(c.arch, tok, None, stacks, contrastive=head)
    raise TformerError(f"arch='{c.arch}' has no description; add one to tformer.cost.architecture.describe")


def _quantized(c, arch: Architecture) -> Architecture:
    """config.quantize: every Linear of the stacks' layers weight-only quantized, and the LM head as
    config.quantize_head says (a tied head gets its own weight); embeddings, norms and other heads stay float.
    Recurrent models are refused by the config."""

    def quantizer(layout: str):
        if layout == "none":
            return lambda lin: lin
        bits, group = QUANT_BITS[layout], (c.quant_group or 0) if layout == "int4" else BLOCK_GROUPS.get(layout, 0)

        def q(lin: Linear | None) -> Linear | None:
            if lin is not None and group and lin.d_in % group:
                if layout != "int4":
                    raise TformerError(f"{layout} keeps rows in blocks of {group} weights; {lin.path}'s input width "
                                       f"{lin.d_in} is not a multiple of {group}: choose int8 or int4")
                fits = [str(g) for g in QUANT_GROUPS if lin.d_in % g == 0] or ["none: keep this model at int8"]
                raise TformerError(f"int4 group {group} does not divide {lin.path}'s input width {lin.d_in}; "
                                   f"choose a group that does ({', '.join(fits)})")
            return lin and replace(lin, bits=bits, group=group, layout=layout, tied=False)
        return q

    q = quantizer(c.quantize)

    def layer(ly: Layer) -> Layer:
        att = tuple(replace(a, q=q(a.q), k=q(a.k), v=q(a.v), o=q(a.o)) for a in ly.attention)
        mlp = replace(ly.mlp, up=q(ly.mlp.up), gate=q(ly.mlp.gate), down=q(ly.mlp.down))
        return replace(ly, attention=att, mlp=mlp)
    stacks = tuple(replace(st, layers=tuple(layer(ly) for ly in st.layers)) for st in arch.stacks)
    head = arch.lm_head and replace(arch.lm_head, linear=quantizer(c.quantize_head)(arch.lm_head.linear))
    return replace(arch, stacks=stacks, lm_head=head)


def _task_head(c, bias: bool) -> dict:
    """The task head's fields of Architecture: one Linear "head" over the last stack's width, with a bias as
    BERT's classifier and qa_outputs have and none as GPT-2's and LLaMA's score."""
    if not c.task:
        return {}
    outputs = 2 if c.task == "question-answering" else c.n_classes
    return {"classifier": Linear("head", "classifier", c.d_model, outputs, bias), "task": c.task,
            "pooling": c.pooling}


def _norm(c, path: str, d: int | None = None) -> Norm:
    return Norm(path, d or c.d_model, c.norm, c.norm_eps)


def _lm_head(c, rescale: bool = False, logits_bias: bool = False) -> LMHead:
    return LMHead(Linear("lm_head", "lm_head", c.d_model, c.vocab_size, False, tied=c.tied_embeddings),
                  rescale=rescale, logits_bias=logits_bias)


def _positions(c, stack: str, d: int) -> Positions:
    kind = c.position
    if kind == "learned":
        return Positions(kind, f"{stack}.positions", Table(f"{stack}.positions", (c.max_positions + c.position_offset, d)),
                         offset=c.position_offset)
    if kind == "sinusoidal":
        return Positions(kind, f"{stack}.positions", Table(f"{stack}.positions", (c.max_positions, d), trained=False))
    if kind == "relative":  # one learned scalar per (bucket, head)
        return Positions(kind, f"{stack}.score_bias",
                         Table(f"{stack}.score_bias", (c.relative_attention_num_buckets, c.n_heads)))
    if kind == "alibi":  # fixed slopes, nothing learned
        return Positions(kind, f"{stack}.score_bias")
    return Positions(kind)  # rope (inside attention) or none


def _attention(c, path: str, norm_path: str, cross: bool) -> Attention:
    d, H, Hkv, dh = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
    return Attention(
        path, _norm(c, norm_path),
        q=Linear(f"{path}.q_proj", "qkv_proj", d, H * dh, c.bias),
        k=Linear(f"{path}.k_proj", "qkv_proj", d, Hkv * dh, c.bias),
        v=Linear(f"{path}.v_proj", "qkv_proj", d, Hkv * dh, c.bias),
        o=Linear(f"{path}.o_proj", "out_proj", H * dh, d, c.bias),
        heads=H, kv_heads=Hkv, head_dim=dh, cross=cross, rope=c.position == "rope" and not cross,
        kind_weights=() if cross else _kind_weights(c, f"{path}.attend"),
    )


def _kind_weights(c, path: str) -> tuple[Weights, ...]:
    """Parameters an attention kind learns besides q, k, v, o (cross-attention always runs exact)."""
    if c.attn_impl == "linformer":  # E and F project n_max positions to attn_proj rows
        shape = (c.attn_proj, c.max_positions)
        return Weights(f"{path}.E", shape), Weights(f"{path}.F", shape)
    return ()


def _layer(c, stack: str, i: int, cross: bool, module: int | None = None) -> Layer:
    """Layer ``i`` of the stack, run by the module ``layers.{module}`` (a shared layer's: 0; else i)."""
    p = f"{stack}.layers.{i if module is None else module}"
    attention = (_attention(c, f"{p}.attn", f"{p}.attn_norm", cross=False),)
    if cross:
        attention += (_attention(c, f"{p}.cross_attn", f"{p}.cross_attn_norm", cross=True),)
    d, f = c.d_model, c.d_ff
    mlp = MLP(f"{p}.mlp", _norm(c, f"{p}.mlp_norm"),
              up=Linear(f"{p}.mlp.up", "ffn_up", d, f, c.bias),
              gate=Linear(f"{p}.mlp.gate", "ffn_gate", d, f, c.bias) if c.gated_mlp else None,
              down=Linear(f"{p}.mlp.down", "ffn_down", f, d, c.bias), activation=c.activation)
    return Layer(i, p, attention, mlp)


def _stack(c, name: str, n_layers: int, tables: tuple[Table, ...], causal: bool, cross: bool = False,
           width: int | None = None, shared: bool = False) -> Stack:
    """``width``: the tables' width when it is not d_model (then a projection follows the embeddings)."""
    e = width or c.d_model
    return Stack(
        name, causal, cross, tables, _positions(c, name, e),
        embed_norm=_norm(c, f"{name}.embed_norm", e) if c.embedding_norm else None,
        layers=tuple(_layer(c, name, i, cross, 0 if shared else None) for i in range(n_layers)),
        final_norm=_norm(c, f"{name}.final_norm") if c.final_norm else None,
        embed_proj=Linear(f"{name}.embed_proj", "embedding", e, c.d_model, c.bias) if width else None,
    )


def _vision_stack(c, name: str, pool_norm: bool = False) -> Stack:
    """A ViT's stack (``c``: a vit config): patches and [CLS], a learned table of one position per token, the
    blocks (never causal), then the final norm over every token (vit) or a norm over [CLS] alone (CLIP's)."""
    grid = c.image_size // c.patch_size
    patches = Patches(f"{name}.patch_embed", c.num_channels, c.patch_size, grid, c.d_model, c.patch_bias)
    positions = Positions("learned", f"{name}.positions", Table(f"{name}.positions", (patches.tokens, c.d_model)))
    return Stack(name, False, False, (), positions,
                 embed_norm=_norm(c, f"{name}.embed_norm") if c.embedding_norm else None,
                 layers=tuple(_layer(c, name, i, False) for i in range(c.n_layers)),
                 final_norm=_norm(c, f"{name}.final_norm") if c.final_norm else None,
                 patches=patches, pool_norm=_norm(c, f"{name}.pool_norm") if pool_norm else None)


def _rnn(c, tok: Table) -> Architecture:
    """Embedding -> n_layers recurrent layers (one torch module, path "rnn") -> LM head. No positions: the
    recurrence reads tokens in order. The head is tied to the embedding only where the widths agree
    (d_hidden == d_model); otherwise it has its own weight."""
    layers = tuple(Recurrent(i, "rnn", c.cell, c.d_model if i == 0 else c.d_hidden, c.d_hidden, c.bias)
                   for i in range(c.n_layers))
    stack = Stack("rnn", True, False, (tok,), Positions("none"), None, layers, None)
    tied = c.tied_embeddings and c.d_hidden == c.d_model
    head = LMHead(Linear("lm_head", "lm_head", c.d_hidden, c.vocab_size, False, tied=tied))
    return Architecture(c.arch, tok, None, (stack,), lm_head=head)


def rnn_seq2seq_widths(c) -> tuple[int, int]:
    """arch='rnn-seq2seq': (the decoder's first-layer input width, the LM head's input width). Bahdanau's
    decoder reads [embedding; context] and its head [s_t; c_t]; Luong's reads [embedding; h~_{t-1}] with
    input feeding and its head h~_t; without attention, the embedding and s_t."""
    h = c.d_hidden
    if c.rnn_attention == "bahdanau":
        return c.d_model + h, 2 * h
    feeding = c.rnn_attention.startswith("luong") and c.rnn_input_feeding
    return c.d_model + (h if feeding else 0), h


def _rnn_seq2seq(c, tok: Table) -> Architecture:
    """Embedding -> recurrent encoder ("encoder", both ways if bidirectional, then a bridge to width h) ->
    recurrent decoder ("decoder", started from the encoder's final state) with attention ("attention") over
    the encoder's outputs -> LM head. The token table serves both sides, as in the Transformer."""
    h, L, bias = c.d_hidden, c.n_layers, c.bias
    directions = 2 if c.bidirectional else 1
    enc = tuple(Recurrent(i, "encoder", c.cell, c.d_model if i == 0 else directions * h, h, bias, directions)
                for i in range(L))
    if c.bidirectional:
        memory = Linear("bridge.memory", "rnn_bridge", 2 * h, h, bias) if c.rnn_attention != "none" else None
        enc += (Bridge(L - 1, memory,
                       Linear("bridge.state", "rnn_bridge", 2 * h, h, bias), 2 if c.cell == "lstm" else 1, L),)
    d_in, width = rnn_seq2seq_widths(c)
    dec = tuple(Recurrent(i, "decoder", c.cell, d_in if i == 0 else h, h, bias, state_grad=True) for i in range(L))
    kind = c.rnn_attention
    if kind != "none":
        def lin(name, d_in_, d_out):  # the papers' attention layers have no bias
            return Linear(f"attention.{name}", "rnn_attention", d_in_, d_out, False)
        dec += (RecurrentAttention(
            L - 1, "attention", kind, h,
            keys=lin("key_proj", h, h) if kind in ("bahdanau", "luong-general") else None,
            query=lin("query_proj", h, h) if kind == "bahdanau" else None,
            score=lin("score", h, 1) if kind == "bahdanau" else None,
            combine=lin("combine", 2 * h, h) if kind.startswith("luong") else None),)
    stacks = (Stack("encoder", False, False, (tok,), Positions("none"), None, enc, None),
              Stack("decoder", True, True, (tok,), Positions("none"), None, dec, None))
    tied = c.tied_embeddings and width == c.d_model
    return Architecture(c.arch, tok, None, stacks, lm_head=LMHead(Linear("lm_head", "lm_head", width, c.vocab_size,
                                                                         False, tied=tied)))
