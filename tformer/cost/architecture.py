"""One description of each architecture: its stacks, its blocks in the order they run, each block
named by the model's module path and sized by tuples.

The model builds its modules from it (tformer.model) and the ledger walks it (tformer.cost.oplist),
so the two cannot drift: tests hold ``describe(config).parameters()`` equal to the names and shapes
of ``model.named_parameters()``. Each architecture has one describer here (``describe_<arch>``, a
function of the config), named by the architecture's record in tformer.core.architectures; ``describe``
looks it up there, so nothing here dispatches on ``config.arch``. A new architecture is one record, its
describer, its model file and its runner.

Plain data: no torch, no costs. The parts are tformer.cost.description's dataclasses (imported here too, so
``from tformer.cost.architecture import Linear`` keeps working); this module builds them from a config.
"""

from __future__ import annotations

from dataclasses import replace

from tformer.core.architectures import arch_record
from tformer.core.quant_formats import BLOCK_GROUPS, KEPT_BLOCKS, LAYER_ROLES, QUANT_BITS, QUANT_GROUPS, layer_formats
from tformer.core.errors import TformerError
from tformer.cost.description import (
    MLP,
    Architecture,
    Attention,
    Bridge,
    Contrastive,
    Layer,
    Linear,
    LMHead,
    MLMHead,
    Norm,
    Patches,
    Positions,
    Recurrent,
    RecurrentAttention,
    Stack,
    Table,
    Weights,
)


# Building the description from a config ------------------------------------------------------
def describe(config) -> Architecture:
    """The description of ``config``'s model, its Linears quantized where config.quantize says so. The
    describer is the one the architecture's record names (tformer.core.architectures)."""
    arch = describer(config.arch)(config)
    return arch if config.quantize == config.quantize_head == "none" else _quantized(config, arch)


def describer(arch: str):
    """The function that describes arch ``arch`` (config -> Architecture), as its record names it."""
    return arch_record(arch).resolve("describer", __name__)


# The describers, one per architecture: each a function of the config, named by its record (the recurrent
# ones, describe_rnn and describe_rnn_seq2seq, sit below beside their helpers).
def describe_decoder(c) -> Architecture:
    tok = _tok(c)
    return Architecture(c.arch, tok, None, (_stack(c, "decoder", c.n_layers, (tok,), causal=True),),
                        lm_head=None if c.task else _lm_head(c), **_task_head(c, bias=False))


def describe_encoder(c) -> Architecture:
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


def describe_encoder_decoder(c) -> Architecture:
    tok = _tok(c)
    stacks = (_stack(c, "encoder", c.n_layers, (tok,), causal=False),
              _stack(c, "decoder", c.n_decoder_layers, (tok,), causal=True, cross=True))
    return Architecture(c.arch, tok, None, stacks,
                        lm_head=_lm_head(c, rescale=c.rescale_tied_head, logits_bias=c.final_logits_bias))


def describe_vit(c) -> Architecture:
    head = Linear("head", "classifier", c.d_model, c.n_classes, True) if c.n_classes else None
    return Architecture(c.arch, None, None, (_vision_stack(c, "encoder"),), classifier=head)


def describe_clip(c) -> Architecture:
    tok, vision = _tok(c), c.vision_tower()
    stacks = (_vision_stack(vision, "vision", pool_norm=True), _stack(c, "text", c.n_layers, (tok,), causal=True))
    head = Contrastive("head", Linear("head.vision_proj", "projection", vision.d_model, c.projection_dim, False),
                       Linear("head.text_proj", "projection", c.d_model, c.projection_dim, False))
    return Architecture(c.arch, tok, None, stacks, contrastive=head)


def _quantized(c, arch: Architecture) -> Architecture:
    """config.quantize: every Linear of the stacks' layers weight-only quantized, and the LM head as
    config.quantize_head says (a tied head gets its own weight, except in a GGUF block format, whose blocks the token
    lookup reads too); embeddings, norms and other heads stay float.
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

    def layer(ly: Layer, index: int) -> Layer:
        if c.quantize == "mixed":  # one format per Linear of this layer
            q = {role: quantizer(fmt) for role, fmt in layer_formats(c.quantize_layers[index], index).items()}
        else:
            q = dict.fromkeys(LAYER_ROLES, quantizer(c.quantize))
        att = tuple(replace(a, q=q["q"](a.q), k=q["k"](a.k), v=q["v"](a.v), o=q["o"](a.o)) for a in ly.attention)
        mlp = replace(ly.mlp, up=q["up"](ly.mlp.up), gate=q["gate"](ly.mlp.gate), down=q["down"](ly.mlp.down))
        return replace(ly, attention=att, mlp=mlp)
    stacks = tuple(replace(st, layers=tuple(layer(ly, i) for i, ly in enumerate(st.layers))) for st in arch.stacks)
    head = arch.lm_head and replace(arch.lm_head, linear=quantizer(c.quantize_head)(arch.lm_head.linear))
    if head and arch.lm_head.linear.tied and c.quantize_head in KEPT_BLOCKS:
        # One copy in blocks serves both: the head's product and the token lookup (a row of blocks widened per
        # token), as llama.cpp reads a tied token_embd; the table holds no weight of its own.
        head = replace(head, linear=replace(head.linear, tied=True))
        table = replace(arch.tok_embed, layout=c.quantize_head)
        stacks = tuple(replace(st, tables=tuple(table if t.path == table.path else t for t in st.tables))
                       for st in stacks)
        return replace(arch, stacks=stacks, lm_head=head, tok_embed=table)
    return replace(arch, stacks=stacks, lm_head=head)


def _task_head(c, bias: bool) -> dict:
    """The task head's fields of Architecture: one Linear "head" over the last stack's width, with a bias as
    BERT's classifier and qa_outputs have and none as GPT-2's and LLaMA's score."""
    if not c.task:
        return {}
    outputs = 2 if c.task == "question-answering" else c.n_classes
    return {"classifier": Linear("head", "classifier", c.d_model, outputs, bias), "task": c.task,
            "pooling": c.pooling}


def _tok(c) -> Table:
    return Table("tok_embed", (c.vocab_size, c.d_model))


def _norm(c, path: str, d: int | None = None) -> Norm:
    return Norm(path, d or c.d_model, c.norm, c.norm_eps)


def _lm_head(c, rescale: bool = False, logits_bias: bool = False) -> LMHead:
    return LMHead(Linear("lm_head", "lm_head", c.d_model, c.vocab_size, False, tied=c.tied_embeddings),
                  rescale=rescale, logits_bias=logits_bias, softcap=c.logit_softcap is not None)


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
    qk_norm = c.qk_norm and not cross
    sandwich = c.norm_placement == "sandwich"
    return Attention(
        path, _norm(c, norm_path),
        q=Linear(f"{path}.q_proj", "qkv_proj", d, H * dh, c.qkv_has_bias),
        k=Linear(f"{path}.k_proj", "qkv_proj", d, Hkv * dh, c.qkv_has_bias),
        v=Linear(f"{path}.v_proj", "qkv_proj", d, Hkv * dh, c.qkv_has_bias),
        o=Linear(f"{path}.o_proj", "out_proj", H * dh, d, c.bias),
        heads=H, kv_heads=Hkv, head_dim=dh, cross=cross, rope=c.position == "rope" and not cross,
        kind_weights=() if cross else _kind_weights(c, f"{path}.attend"),
        q_norm=_norm(c, f"{path}.q_norm", dh) if qk_norm else None,
        k_norm=_norm(c, f"{path}.k_norm", dh) if qk_norm else None,
        post_norm=_norm(c, f"{norm_path.rsplit('.', 1)[0]}.{'cross_attn' if cross else 'attn'}_post_norm")
        if sandwich and not cross else None,
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
              down=Linear(f"{p}.mlp.down", "ffn_down", f, d, c.bias), activation=c.activation,
              post_norm=_norm(c, f"{p}.mlp_post_norm") if c.norm_placement == "sandwich" else None)
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


def describe_rnn(c) -> Architecture:
    """Embedding -> n_layers recurrent layers (one torch module, path "rnn") -> LM head. No positions: the
    recurrence reads tokens in order. The head is tied to the embedding only where the widths agree
    (d_hidden == d_model); otherwise it has its own weight."""
    tok = _tok(c)
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


def describe_rnn_seq2seq(c) -> Architecture:
    """Embedding -> recurrent encoder ("encoder", both ways if bidirectional, then a bridge to width h) ->
    recurrent decoder ("decoder", started from the encoder's final state) with attention ("attention") over
    the encoder's outputs -> LM head. The token table serves both sides, as in the Transformer."""
    tok, h, L, bias = _tok(c), c.d_hidden, c.n_layers, c.bias
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


__all__ = ["describe", "describer", "rnn_seq2seq_widths",
           "describe_clip", "describe_decoder", "describe_encoder", "describe_encoder_decoder", "describe_rnn",
           "describe_rnn_seq2seq", "describe_vit",  # and the parts, from tformer.cost.description:
           "Architecture", "Attention", "Bridge", "Contrastive", "LMHead", "Layer", "Linear", "MLMHead", "MLP", "Norm",
           "Patches", "Positions", "Recurrent", "RecurrentAttention", "Stack", "Table", "Weights"]
