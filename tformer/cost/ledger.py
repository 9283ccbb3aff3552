"""The ledger: (config, workload) -> the list of ops a forward pass, training step, prefill or decode
step performs, in the order the model runs them. Every total is a sum over that list.

The op list mirrors tformer/model: one row per nn.Linear, norm and embedding (named by its module
path), plus the steps inside attention and the feed-forward block that have no module of their
own (scores, softmax, context, activation, residual adds). Nothing is allocated; it is arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from tformer.cost import ops as O
from tformer.cost.ops import Op
from tformer.core.errors import TformerError

WORKLOAD_PHASES = ("forward", "train", "prefill", "decode")
DTYPES = ("fp32", "fp16", "bf16", "int8")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
ATTENTION_FLOPS = ("full", "causal")

# Bytes per element. int8 is a weights-only format: activations and the KV cache stay 16-bit.
WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
ACTIVATION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 2}
INDEX_BYTES = 8  # token ids are int64
MASK_BYTES = 1  # a dropout mask keeps one byte per element (torch.bool)
LOSS_BYTES = 4  # the model computes the loss in fp32 (lm_loss casts the logits with .float())


@dataclass(frozen=True)
class Workload:
    """What the model is asked to do.

    phase: forward | train (forward + backward + optimizer step) | prefill (forward over a
    prompt, writing the KV cache) | decode (one new token per sequence, with ``context`` tokens
    already in the cache). For an encoder-decoder, ``seq`` is the source length and
    ``seq_decoder`` the target length (default: seq); in decode, the encoder output is cached.
    """

    phase: str = "forward"
    batch: int = 1
    seq: int = 128
    context: int | None = None  # decode: tokens already cached (default seq - 1)
    seq_decoder: int | None = None
    dtype: str = "fp32"  # weights; activations too, except int8 (weights only, 16-bit activations)
    optimizer: str = "adamw"
    mixed_precision: bool = False  # 16-bit weights/activations with an fp32 master copy in the optimizer
    fp32_grads: bool = False  # mixed precision: keep gradients in fp32 (18 B/param with Adam, not 16)
    checkpointing: bool = False  # recompute each layer in the backward pass, keep only layer inputs
    attention_flops: str = "full"  # full s x s (FlopCounterMode) | causal (only unmasked query-key pairs)
    materialize_scores: bool = True  # False: a fused (flash) kernel never stores the s x s scores

    def __post_init__(self) -> None:
        def choice(name, options):
            if getattr(self, name) not in options:
                raise TformerError(f"{name}='{getattr(self, name)}' is unknown; choose one of: {', '.join(options)}")

        choice("phase", WORKLOAD_PHASES)
        choice("dtype", DTYPES)
        choice("optimizer", OPTIMIZERS)
        choice("attention_flops", ATTENTION_FLOPS)
        for name in ("batch", "seq", "seq_decoder"):
            value = getattr(self, name)
            if value is None and name == "seq_decoder":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TformerError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.context is not None and (isinstance(self.context, bool) or not isinstance(self.context, int) or self.context < 0):
            raise TformerError(f"context must be a whole number of at least 0, got {self.context!r}")
        if self.dtype == "int8" and self.phase == "train":
            raise TformerError("int8 is a weights-only inference format; train in fp32, bf16 or fp16")
        if self.mixed_precision and self.dtype not in ("fp16", "bf16"):
            raise TformerError("mixed precision means 16-bit compute with fp32 master weights; use dtype fp16 or bf16")

    @property
    def training(self) -> bool:
        return self.phase == "train"

    @property
    def decode_context(self) -> int:
        return self.context if self.context is not None else self.seq - 1


@dataclass
class _Stack:
    """Token counts seen by one stack: queries, keys (self-attention), and the rows it runs on."""

    name: str  # "encoder" | "decoder"
    layers: int
    tq: int  # new positions processed
    tk: int  # keys each query sees in self-attention (past + new)
    causal: bool
    cross_keys: int = 0  # encoder positions (cross-attention), 0 = no cross-attention
    cross_cached: bool = False  # decode: cross K/V come from the cache, not projected


@dataclass
class Ledger:
    config: object
    workload: Workload
    ops: list[Op] = field(default_factory=list)

    # Selections --------------------------------------------------------------------------
    def select(self, phase: str | None = None, kind: str | tuple | None = None, layer: int | None = None,
               stack: str | None = None, prefix: str | None = None) -> list[Op]:
        kinds = (kind,) if isinstance(kind, str) else kind
        return [
            op for op in self.ops
            if (phase is None or op.phase == phase) and (kinds is None or op.kind in kinds)
            and (layer is None or op.layer == layer) and (stack is None or op.stack == stack)
            and (prefix is None or op.name.startswith(prefix))
        ]

    @staticmethod
    def total(ops: list[Op], attr: str) -> int:
        return sum(getattr(op, attr) for op in ops)

    # Parameters ----------------------------------------------------------------------------
    @cached_property
    def params(self) -> dict:
        """total, embedding (token, token-type and position tables), non_embedding, per component."""
        fwd = [op for op in self._param_source().ops if op.phase == "forward"]
        by_component: dict[str, int] = {}
        for op in fwd:
            if op.params:
                comp = _component(op)
                by_component[comp] = by_component.get(comp, 0) + op.params
        total = self.total(fwd, "params")
        embedding = self.total(fwd, "embedding_params")
        return {"total": total, "embedding": embedding, "non_embedding": total - embedding, "by_component": by_component}

    def _param_source(self) -> "Ledger":
        """The op list that holds every parameter once. A decode step of an encoder-decoder does
        not run the encoder, yet its weights are in memory: count them from a forward op list."""
        if self.workload.phase == "decode" and self.config.arch == "encoder-decoder":
            return ledger(self.config, Workload(phase="forward", batch=1, seq=1, dtype=self.workload.dtype))
        return self

    # FLOPs -----------------------------------------------------------------------------------
    @cached_property
    def flops(self) -> dict:
        out = {"matmul": self.total(self.ops, "matmul_flops"), "other": self.total(self.ops, "other_flops")}
        out["total"] = out["matmul"] + out["other"]
        out["by_phase"] = {}
        for phase in O.PHASES:
            sel = self.select(phase=phase)
            if sel:
                m, o = self.total(sel, "matmul_flops"), self.total(sel, "other_flops")
                out["by_phase"][phase] = {"matmul": m, "other": o, "total": m + o}
        return out

    @property
    def tokens(self) -> int:
        """Tokens processed (the D of 6ND): every position of every stack that runs."""
        w, c = self.workload, self.config
        if w.phase == "decode":
            return w.batch
        n = w.batch * w.seq
        if c.arch == "encoder-decoder":
            n += w.batch * (w.seq_decoder or w.seq)
        return n

    @cached_property
    def rules_of_thumb(self) -> dict:
        from tformer.cost.scaling import rules_of_thumb

        return rules_of_thumb(self)

    @cached_property
    def memory(self) -> dict:
        from tformer.cost.memory import memory_breakdown

        return memory_breakdown(self)

    def conventions(self) -> dict:
        from tformer.cost.conventions import conventions

        return conventions(self.workload)

    def to_dict(self, include_ops: bool = True) -> dict:
        w = self.workload
        d = {
            "model": getattr(self.config, "name", "custom"),
            "workload": {k: getattr(w, k) for k in w.__dataclass_fields__},
            "tokens": self.tokens,
            "params": self.params,
            "flops": self.flops,
            "rules_of_thumb": self.rules_of_thumb,
            "memory": self.memory,
            "conventions": self.conventions(),
        }
        if w.phase == "decode":
            d["workload"]["context"] = w.decode_context
        if include_ops:
            d["ops"] = [op.to_dict() for op in self.ops]
        return d


def _component(op: Op) -> str:
    if op.kind in ("qkv_proj", "out_proj"):
        return "cross_attention" if ".cross_attn." in op.name else "attention"
    if op.kind in ("ffn_up", "ffn_gate", "ffn_down"):
        return "ffn"
    if op.kind == "norm":
        return "norm" if not op.name.startswith("mlm_head") else "lm_head"
    return op.kind  # embedding, position, pooler, lm_head


# Building the op list --------------------------------------------------------------------------
def ledger(config, workload: Workload | None = None, **workload_fields) -> Ledger:
    """The op list for ``config`` running ``workload`` (or a Workload built from keyword fields)."""
    if workload is None:
        workload = Workload(**workload_fields)
    elif workload_fields:
        workload = replace(workload, **workload_fields)
    _check(config, workload)
    b = _Builder(config, workload)
    b.build()
    return Ledger(config, workload, b.ops)


def _check(config, w: Workload) -> None:
    if config.arch == "encoder" and w.phase in ("prefill", "decode"):
        raise TformerError(f"an encoder-only model does not generate, so phase '{w.phase}' does not apply; use forward or train")
    if config.position in ("learned", "sinusoidal"):
        need = {"decode": w.decode_context + 1}.get(w.phase, max(w.seq, w.seq_decoder or 0))
        if need > config.max_positions:
            raise TformerError(
                f"{need} positions exceed the model's max_positions={config.max_positions} "
                f"({config.position} position table); use a shorter --seq/--context or raise max_positions"
            )


class _Builder:
    def __init__(self, config, w: Workload):
        self.c, self.w = config, w
        self.a = ACTIVATION_BYTES[w.dtype]
        self.wb = WEIGHT_BYTES[w.dtype]
        self.train = w.training
        self.ops: list[Op] = []
        self.decode = w.phase == "decode"
        self.keep_cache = w.phase in ("prefill", "decode")

    # Helpers ---------------------------------------------------------------------------------
    def add(self, op: Op) -> Op:
        if not self.train:
            op.saved_bytes = op.scores_bytes = 0
        self.ops.append(op)
        return op

    def linear(self, name, kind, layer, stack, rows, d_in, d_out, bias, owns_weight=True, saves_input=True) -> Op:
        a, wb = self.a, self.wb
        n_params = O.linear_params(d_in, d_out, bias) if owns_weight else (d_out if bias else 0)
        return self.add(Op(
            name=name, kind=kind, layer=layer, phase="forward", stack=stack,
            shapes=f"[{rows}, {d_in}] @ [{d_in}, {d_out}]" + (" + bias" if bias else ""),
            matmul_flops=O.matmul_flops(rows, d_in, d_out),
            other_flops=rows * d_out if bias else 0,  # the bias add of addmm (FlopCounterMode skips it)
            bytes_read=rows * d_in * a + O.linear_params(d_in, d_out, bias) * wb,
            bytes_written=rows * d_out * a,
            params=n_params, weight_bytes=O.linear_params(d_in, d_out, bias) * wb,
            saved_bytes=rows * d_in * a if saves_input else 0,
        ))

    def norm(self, name, layer, stack, rows) -> Op:
        c, a = self.c, self.a
        d = c.d_model
        return self.add(Op(
            name=name, kind="norm", layer=layer, phase="forward", stack=stack, shapes=f"[{rows}, {d}] {c.norm}",
            other_flops=O.norm_flops(rows * d, c.norm), bytes_read=rows * d * a + O.norm_params(d, c.norm) * self.wb,
            bytes_written=rows * d * a, params=O.norm_params(d, c.norm), weight_bytes=O.norm_params(d, c.norm) * self.wb,
            saved_bytes=rows * d * a,  # the input (Korthikanti et al. 2022 convention)
        ))

    def elementwise(self, name, kind, layer, stack, elements, flops_per, reads=1, saved=0, shapes="") -> Op:
        a = self.a
        return self.add(Op(name=name, kind=kind, layer=layer, phase="forward", stack=stack,
                           shapes=shapes or f"[{elements}] elements", other_flops=elements * flops_per,
                           bytes_read=reads * elements * a, bytes_written=elements * a, saved_bytes=saved))

    def dropout_mask(self, p: float, elements: int) -> int:
        return elements * MASK_BYTES if (self.train and p > 0) else 0

    # The model ---------------------------------------------------------------------------------
    def build(self) -> None:
        c, w = self.c, self.w
        B = w.batch
        if c.arch == "decoder":
            ctx = w.decode_context if self.decode else 0
            tq = 1 if self.decode else w.seq
            dec = _Stack("decoder", c.n_layers, tq, ctx + tq, causal=True)
            self.embed(dec, B * tq, type_embed=False)
            self.stack(dec)
            self.lm_head(B * tq, "lm_head")
        elif c.arch == "encoder":
            enc = _Stack("encoder", c.n_layers, w.seq, w.seq, causal=False)
            self.embed(enc, B * w.seq, type_embed=c.type_vocab_size > 0)
            self.stack(enc)
            self.encoder_heads(B, w.seq)
        else:
            S = w.seq
            if not self.decode:
                enc = _Stack("encoder", c.n_layers, S, S, causal=False)
                self.embed(enc, B * S, type_embed=False)
                self.stack(enc)
            ctx = w.decode_context if self.decode else 0
            tq = 1 if self.decode else (w.seq_decoder or w.seq)
            # The first decode step (empty cache) still projects the encoder output; later steps reuse it.
            dec = _Stack("decoder", c.n_decoder_layers, tq, ctx + tq, causal=True, cross_keys=S,
                         cross_cached=self.decode and ctx > 0)
            self.embed(dec, B * tq, type_embed=False, shared_table=not self.decode)
            self.stack(dec)
            self.lm_head(B * tq, "lm_head")
        if self.train:
            self.backward_and_optimizer()

    def embed(self, st: _Stack, rows: int, type_embed: bool, shared_table: bool = False) -> None:
        """Token lookup (+ segment table) (+ position table). ``shared_table``: the encoder already
        owns the token table, so the decoder's lookup owns no parameters."""
        c, a, wb = self.c, self.a, self.wb
        d = c.d_model
        V = c.vocab_size
        own = 0 if shared_table else V * d
        self.add(Op(name="tok_embed", kind="embedding", layer=None, phase="forward", stack=st.name,
                    shapes=f"[{rows}] ids -> [{rows}, {d}] from [{V}, {d}]",
                    other_flops=rows * d if c.scale_embeddings else 0,
                    bytes_read=rows * INDEX_BYTES + rows * d * wb, bytes_written=rows * d * a,
                    params=own, embedding_params=own, weight_bytes=rows * d * wb))
        if type_embed:
            n = c.type_vocab_size * d
            self.add(Op(name="type_embed", kind="embedding", layer=None, phase="forward", stack=st.name,
                        shapes=f"[{rows}] ids -> [{rows}, {d}] from [{c.type_vocab_size}, {d}]", other_flops=rows * d,
                        bytes_read=rows * INDEX_BYTES + rows * d * wb + rows * d * a, bytes_written=rows * d * a,
                        params=n, embedding_params=n, weight_bytes=rows * d * wb))
        p = f"{st.name}."
        if c.position in ("learned", "sinusoidal"):
            n = (c.max_positions + c.position_offset) * d if c.position == "learned" else 0
            self.add(Op(name=p + "positions", kind="position", layer=None, phase="forward", stack=st.name,
                        shapes=f"[{rows}, {d}] + table[{c.max_positions + c.position_offset}, {d}]", other_flops=rows * d,
                        bytes_read=rows * d * (a + (wb if c.position == "learned" else 4)), bytes_written=rows * d * a,
                        params=n, embedding_params=n, weight_bytes=rows * d * wb if n else 0))
        elif c.position in ("alibi", "relative"):
            # One (1, H, Tq, Tk) bias per forward pass, shared by every layer of the stack.
            elems = c.n_heads * st.tq * st.tk
            n = c.relative_attention_num_buckets * c.n_heads if c.position == "relative" else 0
            self.add(Op(name=p + "score_bias", kind="position", layer=None, phase="forward", stack=st.name,
                        shapes=f"[1, {c.n_heads}, {st.tq}, {st.tk}]", other_flops=elems, bytes_read=n * wb,
                        bytes_written=elems * a, params=n, embedding_params=0, weight_bytes=n * wb))
        if c.embedding_norm:
            self.norm(p + "embed_norm", None, st.name, rows)
        mask = self.dropout_mask(c.dropout, rows * d)
        if mask:
            self.ops[-1].saved_bytes += mask

    def stack(self, st: _Stack) -> None:
        B, c = self.w.batch, self.c
        rows = B * st.tq
        for i in range(st.layers):
            p = f"{st.name}.layers.{i}."
            self.attention(p + "attn", p + "attn_norm", i, st, rows, cross=False)
            if st.cross_keys:
                self.attention(p + "cross_attn", p + "cross_attn_norm", i, st, rows, cross=True)
            self.mlp(p, i, st, rows)
        if c.final_norm:
            self.norm(f"{st.name}.final_norm", None, st.name, rows)

    def attention(self, p, norm_name, i, st: _Stack, rows, cross: bool) -> None:
        c, w, a = self.c, self.w, self.a
        B, d, H, Hkv, dh = w.batch, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
        tq = st.tq
        tk = st.cross_keys if cross else st.tk
        self.norm(norm_name, i, st.name, rows)
        self.linear(p + ".q_proj", "qkv_proj", i, st.name, rows, d, H * dh, c.bias)
        if cross and st.cross_cached:
            pass  # decode: the encoder output's keys and values were projected once and cached
        else:
            kv_rows = B * tk if cross else rows
            # k and v read the same input as q (self) or the encoder output (cross, kept once).
            saves = cross and i == 0
            self.linear(p + ".k_proj", "qkv_proj", i, st.name, kv_rows, d, Hkv * dh, c.bias, saves_input=saves)
            self.linear(p + ".v_proj", "qkv_proj", i, st.name, kv_rows, d, Hkv * dh, c.bias, saves_input=False)
        if c.position == "rope" and not cross:
            elems = B * tq * (H + Hkv) * dh
            self.elementwise(p + ".rope", "rope", i, st.name, elems, O.ROPE_FLOPS_PER_ELEMENT,
                             shapes=f"q [{B}, {H}, {tq}, {dh}], k [{B}, {Hkv}, {tq}, {dh}]")

        # Query-key pairs the FLOP count charges: all of them (what the reference path computes),
        # or under 'causal' accounting only those the causal mask allows.
        pairs = tq * tk
        if w.attention_flops == "causal" and st.causal and not cross:
            past = tk - tq
            pairs = tq * past + tq * (tq + 1) // 2
        score_elems = B * H * tq * tk
        mm = O.matmul_flops(1, dh, 1, batch=B * H * pairs)
        _, q_k_read, s_written = O.attention_scores_cost(B, H, tq, tk, dh, a, Hkv)
        kv_bytes = B * Hkv * tk * dh * a
        fused = not w.materialize_scores
        extra = 1 if (st.causal and not cross and tq > 1) or (c.position in ("alibi", "relative") and not cross) else 0
        # The K (or V) this layer holds in the KV cache; an encoder's self-attention keeps none.
        cache = kv_bytes if self.keep_cache and st.name == "decoder" else 0
        scores_saved = B * H * tq * dh * a + kv_bytes  # Q and K
        self.add(Op(name=p + ".scores", kind="scores", layer=i, phase="forward", stack=st.name,
                    shapes=f"[{B}, {H}, {tq}, {dh}] @ [{B}, {H}, {dh}, {tk}]" + (" (causal pairs)" if pairs != tq * tk else ""),
                    matmul_flops=mm,
                    bytes_read=q_k_read, bytes_written=0 if fused else s_written,
                    saved_bytes=scores_saved, cache_bytes=cache))
        attn_p = c.attention_dropout if self.train else 0.0
        sm_saved = 0 if fused else score_elems * a  # softmax keeps its output for the backward
        if attn_p > 0 and not fused:
            sm_saved += score_elems * (MASK_BYTES + a)  # dropout mask and the dropped-out weights (used by AV)
        if fused:
            sm_saved = B * H * tq * 4  # flash attention keeps only the fp32 log-sum-exp per row
        self.add(Op(name=p + ".softmax", kind="softmax", layer=i, phase="forward", stack=st.name,
                    shapes=f"[{B}, {H}, {tq}, {tk}]",
                    # scale, (+ mask or position bias), softmax: the element-wise work between the two matmuls
                    other_flops=score_elems * (1 + extra + O.SOFTMAX_FLOPS_PER_ELEMENT),
                    bytes_read=0 if fused else s_written, bytes_written=0 if fused else s_written,
                    saved_bytes=sm_saved, scores_bytes=0 if fused else sm_saved))
        self.add(Op(name=p + ".context", kind="context", layer=i, phase="forward", stack=st.name,
                    shapes=f"[{B}, {H}, {tq}, {tk}] @ [{B}, {H}, {tk}, {dh}]",
                    matmul_flops=mm, bytes_read=(0 if fused else s_written) + kv_bytes,
                    bytes_written=B * H * tq * dh * a, saved_bytes=kv_bytes,  # V (weights counted at softmax)
                    cache_bytes=cache))
        self.linear(p + ".o_proj", "out_proj", i, st.name, rows, H * dh, d, c.bias)
        self.residual(p + ".residual", i, st.name, rows)

    def mlp(self, p, i, st: _Stack, rows) -> None:
        c, a = self.c, self.a
        d, f = c.d_model, c.d_ff
        self.norm(p + "mlp_norm", i, st.name, rows)
        self.linear(p + "mlp.up", "ffn_up", i, st.name, rows, d, f, c.bias)
        if c.gated_mlp:
            self.linear(p + "mlp.gate", "ffn_gate", i, st.name, rows, d, f, c.bias, saves_input=False)
        elems = rows * f
        per = O.ACTIVATION_FLOPS_PER_ELEMENT[c.activation] + (1 if c.gated_mlp else 0)  # + the gating multiply
        # Saved: the activation's input; gated also the up output and the activation output (for the product).
        saved = elems * a * (3 if c.gated_mlp else 1) + self.dropout_mask(c.activation_dropout, elems)
        self.elementwise(p + "mlp.act", "activation", i, st.name, elems, per, reads=2 if c.gated_mlp else 1,
                         saved=saved, shapes=f"[{rows}, {f}] {c.activation}" + (" * up" if c.gated_mlp else ""))
        self.linear(p + "mlp.down", "ffn_down", i, st.name, rows, f, d, c.bias)
        self.residual(p + "mlp.residual", i, st.name, rows)

    def residual(self, name, i, stack, rows) -> None:
        elems = rows * self.c.d_model
        self.elementwise(name, "residual", i, stack, elems, 1, reads=2,
                         saved=self.dropout_mask(self.c.dropout, elems), shapes=f"[{rows}, {self.c.d_model}] + same")

    def lm_head(self, rows, name) -> None:
        c = self.c
        d, V = c.d_model, c.vocab_size
        op = self.linear(name, "lm_head", None, "", rows, d, V, False, owns_weight=not c.tied_embeddings)
        if c.arch == "encoder-decoder" and c.rescale_tied_head:
            op.other_flops += rows * d  # hidden * d_model^-0.5 before the tied head (T5)
        if c.arch == "encoder-decoder" and c.final_logits_bias:
            op.other_flops += rows * V  # BART's logits bias (a buffer, not a parameter)
        self.loss(rows)

    def loss(self, rows) -> None:
        if not self.train:
            return
        V, a = self.c.vocab_size, self.a
        self.add(Op(name="loss", kind="loss", layer=None, phase="forward", stack="",
                    shapes=f"cross-entropy over [{rows}, {V}]", other_flops=rows * V * O.CROSS_ENTROPY_FLOPS_PER_LOGIT,
                    bytes_read=rows * V * a + rows * INDEX_BYTES, bytes_written=LOSS_BYTES,
                    saved_bytes=rows * V * LOSS_BYTES))  # the fp32 log-probabilities

    def encoder_heads(self, B, T) -> None:
        c = self.c
        d = c.d_model
        if c.pooler:
            op = self.linear("pooler.dense", "pooler", None, "", B, d, d, c.bias)
            op.other_flops += B * d * O.ACTIVATION_FLOPS_PER_ELEMENT["gelu"]  # tanh, costed like gelu
        if c.lm_head:
            rows = B * T
            self.linear("mlm_head.dense", "lm_head", None, "", rows, d, d, c.bias)
            self.elementwise("mlm_head.act", "activation", None, "", rows * d,
                             O.ACTIVATION_FLOPS_PER_ELEMENT[c.activation], saved=rows * d * self.a)
            self.norm("mlm_head.norm", None, "", rows)
            self.linear("mlm_head.decoder", "lm_head", None, "", rows, d, c.vocab_size, c.bias,
                        owns_weight=not c.tied_embeddings)
            self.loss(rows)

    # Training ------------------------------------------------------------------------------------
    def backward_and_optimizer(self) -> None:
        """Backward: each matmul becomes two (gradient of the input and of the weight), so backward
        matmul FLOPs are exactly 2x forward (what FlopCounterMode counts); element-wise backward work
        and bytes are taken as 2x forward (a convention). Checkpointing adds one recomputed forward
        of every layer. The optimizer touches every parameter once."""
        from tformer.cost.memory import optimizer_bytes_per_param, OPTIMIZER_FLOPS_PER_PARAM

        w = self.w
        forward = list(self.ops)
        if w.checkpointing:
            for op in forward:
                if op.layer is not None:
                    self.ops.append(replace(op, phase="recompute", params=0, embedding_params=0, saved_bytes=0,
                                            scores_bytes=0, cache_bytes=0))
        for op in reversed(forward):
            self.ops.append(replace(
                op, phase="backward", matmul_flops=2 * op.matmul_flops, other_flops=O.BACKWARD_OTHER_FACTOR * op.other_flops,
                bytes_read=2 * op.bytes_read, bytes_written=2 * op.bytes_written, params=0, embedding_params=0,
                saved_bytes=0, scores_bytes=0, cache_bytes=0, weight_bytes=2 * op.weight_bytes))
        per_param = optimizer_bytes_per_param(w)
        flops_per = OPTIMIZER_FLOPS_PER_PARAM[w.optimizer]
        for op in forward:
            if op.params:
                self.ops.append(Op(
                    name=op.name, kind="optimizer", layer=op.layer, phase="optimizer", stack=op.stack,
                    shapes=f"{op.params} params ({w.optimizer})", other_flops=op.params * flops_per,
                    bytes_read=op.params * per_param["read"], bytes_written=op.params * per_param["written"]))
