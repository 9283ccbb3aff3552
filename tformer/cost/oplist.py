"""Building the ledger's op list: walk an architecture's description (tformer.cost.architecture)
for one workload, in the order the model runs.

One row per nn.Linear, norm and embedding (named by its module path, from the description), plus
the steps that have no module of their own (rope, scores, softmax, context, activation, residual
adds, loss). The attention rows come from the cost function of the workload's attention kind.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tformer.core.quant_formats import BLOCK_GROUPS, REPACKED_BLOCKS
from tformer.cost import ops as O
from tformer.cost.architecture import (
    MLP,
    Architecture,
    Attention,
    Bridge,
    Contrastive,
    Linear,
    Norm,
    Patches,
    Recurrent,
    RecurrentAttention,
    Stack,
)
from tformer.cost.attention import attention_rows, costed_kind
from tformer.cost.attention_call import AttentionCall
from tformer.cost.memory import OPTIMIZER_FLOPS_PER_PARAM, optimizer_bytes_per_param
from tformer.cost.ops import MatMul, Op
from tformer.cost.quantized import linear_weight_bytes
from tformer.cost.recurrent import CELL_FLOPS_PER_UNIT, STATES
from tformer.cost.workload import ACTIVATION_BYTES, INDEX_BYTES, LOSS_BYTES, MASK_BYTES, WEIGHT_BYTES, Workload


@dataclass(frozen=True)
class Tokens:
    """Token counts one stack sees: queries, keys (self-attention), encoder positions (cross)."""

    tq: int  # new positions processed
    tk: int  # keys each query sees in self-attention (past + new)
    cross_keys: int = 0  # encoder positions, 0 = no cross-attention
    cross_cached: bool = False  # decode: cross K/V come from the cache, not projected


def stack_tokens(stack: Stack, w: Workload) -> Tokens | None:
    """What ``stack`` processes in workload ``w``; None when it does not run (a decode step reuses
    the encoder's output, so a bidirectional stack runs only outside decode)."""
    decode = w.phase == "decode"
    if stack.patches is not None:  # an image: its patches and [CLS], whatever the workload's seq
        return Tokens(stack.patches.tokens, stack.patches.tokens)
    if not stack.causal:
        return None if decode else Tokens(w.seq, w.seq)
    ctx = w.decode_context if decode else 0
    # A stack that reads an encoder's output is the target side: seq_decoder positions.
    tq = 1 if decode else ((w.seq_decoder or w.seq) if stack.cross else w.seq)
    # The first decode step (empty cache) still projects the encoder output; later steps reuse it.
    return Tokens(tq, ctx + tq, cross_keys=w.seq if stack.cross else 0, cross_cached=decode and ctx > 0)


def backward_op(op: Op) -> Op:
    """The backward row of forward row ``op``: each matmul becomes two (the gradients of both
    operands), so 2x its matmul FLOPs, unless an operand takes no gradient (``backward_matmul_flops``
    says so); element-wise work and bytes 2x forward (a convention)."""
    mm = 2 * op.matmul_flops if op.backward_matmul_flops is None else op.backward_matmul_flops
    return replace(op, phase="backward", matmul_flops=mm,
                   other_flops=O.BACKWARD_OTHER_FACTOR * op.other_flops, bytes_read=2 * op.bytes_read,
                   bytes_written=2 * op.bytes_written, params=0, embedding_params=0, saved_bytes=0, scores_bytes=0,
                   cache_bytes=0, weight_bytes=2 * op.weight_bytes)


class OpListBuilder:
    def __init__(self, config, w: Workload):
        self.c, self.w = config, w
        self.model_config = config  # self.c is the config of the stack being walked (CLIP's vision tower has its own)
        self.a = ACTIVATION_BYTES[w.dtype]
        self.wb = WEIGHT_BYTES[w.dtype]
        self.train = w.training
        self.ops: list[Op] = []
        self.keep_cache = w.phase in ("prefill", "decode")
        self.owned: set[str] = set()  # tables whose parameters an earlier lookup already counted
        self.redone: dict[str, list[Op]] = {}  # forward row name -> rows its backward recomputes first

    # Helpers ---------------------------------------------------------------------------------
    def add(self, op: Op) -> Op:
        if not self.train:
            op.saved_bytes = op.scores_bytes = 0
        self.ops.append(op)
        return op

    def linear(self, spec: Linear, layer, stack, rows, saves_input=True) -> Op:
        a, wb = self.a, self.wb
        d_in, d_out, bias = spec.d_in, spec.d_out, spec.bias
        n_params = (d_out if bias else 0) if spec.tied else O.linear_params(d_in, d_out, bias)
        n_params = self.own(spec.path, n_params)
        return self.add(Op(
            name=spec.path, kind=spec.kind, layer=layer, phase="forward", stack=stack,
            shapes=O.matmul_label((rows, d_in), (d_in, d_out)) + (" + bias" if bias else ""),
            dims=MatMul(1, rows, d_in, d_out, weight=True),
            matmul_flops=O.matmul_flops(rows, d_in, d_out),
            other_flops=rows * d_out if bias else 0,  # the bias add of addmm (FlopCounterMode skips it)
            bytes_read=rows * d_in * a + linear_weight_bytes(spec, wb),
            bytes_written=rows * d_out * a,
            params=n_params, weight_bytes=linear_weight_bytes(spec, wb), weight_layout=spec.layout,
            saved_bytes=rows * d_in * a if saves_input else 0,
        ))

    @staticmethod
    def one_product(pairs: list[tuple[Op, Linear]]) -> None:
        """Linears that read one input (q, k, v; gate, up) run as one block-kernel product where each holds the same
        repacked block format, one input width and all a bias or none (tformer.model.stacked_products): each op
        then carries that product's weight bytes, and the roofline prices it as its share of one call."""
        specs = [spec for _, spec in pairs]
        if (specs[0].layout not in REPACKED_BLOCKS or len({(s.layout, s.d_in, bool(s.bias)) for s in specs}) > 1
                or any(s.tied for s in specs)):
            return
        total = sum(op.weight_bytes for op, _ in pairs)
        for op, _ in pairs:
            op.stack_bytes = total

    def norm(self, spec: Norm, layer, stack, rows) -> Op:
        a, d, kind = self.a, spec.d, spec.kind
        return self.add(Op(
            name=spec.path, kind="norm", layer=layer, phase="forward", stack=stack, shapes=f"[{rows}, {d}] {kind}",
            other_flops=O.norm_flops(rows * d, kind), bytes_read=rows * d * a + O.norm_params(d, kind) * self.wb,
            bytes_written=rows * d * a, params=self.own(spec.path, O.norm_params(d, kind)),
            weight_bytes=O.norm_params(d, kind) * self.wb,
            saved_bytes=rows * d * a,  # the input (Korthikanti et al. 2022 convention)
        ))

    def own(self, path: str, n: int) -> int:
        """``n`` the first time module ``path`` runs, then 0: a shared layer (ALBERT) runs at every
        depth but its parameters count once."""
        if path in self.owned:
            return 0
        self.owned.add(path)
        return n

    def elementwise(self, name, kind, layer, stack, elements, flops_per, reads=1, saved=0, shapes="") -> Op:
        a = self.a
        return self.add(Op(name=name, kind=kind, layer=layer, phase="forward", stack=stack,
                           shapes=shapes or f"[{elements}] elements", other_flops=elements * flops_per,
                           bytes_read=reads * elements * a, bytes_written=elements * a, saved_bytes=saved))

    def dropout_mask(self, p: float, elements: int) -> int:
        return elements * MASK_BYTES if (self.train and p > 0) else 0

    # The model ---------------------------------------------------------------------------------
    def build(self, arch: Architecture) -> list[Op]:
        rows = 0
        for st in arch.stacks:
            tokens = stack_tokens(st, self.w)
            if tokens is None:
                continue
            self.c = self.model_config.vision_tower() if arch.contrastive and st.patches else self.model_config
            rows = self.w.batch * tokens.tq
            if st.patches is not None:
                self.patches(st.patches, st.name, rows)
            else:
                self.embed(st, tokens, rows)
            self.enter(st, tokens, rows)
            for layer in st.layers:
                if isinstance(layer, Recurrent):
                    self.recurrent(layer, st.name, tokens, rows)
                    continue
                if isinstance(layer, (Bridge, RecurrentAttention)):  # arch='rnn-seq2seq'
                    (self.bridge if isinstance(layer, Bridge) else self.recurrent_attention)(layer, st.name, tokens)
                    continue
                for att in layer.attention:
                    self.attention(att, layer.index, st, tokens, rows)
                self.mlp(layer.mlp, layer.index, st.name, rows)
            if st.final_norm:
                self.norm(st.final_norm, None, st.name, rows)
            if st.pool_norm:  # CLIP: over each image's [CLS] state only
                self.norm(st.pool_norm, None, st.name, self.w.batch)
        self.c = self.model_config
        self.heads(arch, rows)  # on the last stack's output
        if self.train:
            self.backward_and_optimizer(arch.loss_skips)
        return self.ops

    def patches(self, spec: Patches, stack: str, rows: int) -> None:
        """The patch projection as the matmul it is ((B grid^2, C P^2) x (C P^2, d), the convolution's FLOPs as
        FlopCounterMode counts them; the pixels take no gradient, so its backward is the weight's alone),
        [CLS] put in front, then the learned positions added to all n = grid^2 + 1 tokens (``embed``'s rows)."""
        a, B, d = self.a, self.w.batch, spec.d
        n_patches = B * spec.grid * spec.grid
        op = self.linear(spec.linear, None, stack, n_patches)
        op.shapes = (f"[{B}, {spec.channels}, {spec.grid * spec.patch}, {spec.grid * spec.patch}] -> {n_patches} patches "
                     "of " + O.matmul_label((n_patches, spec.linear.d_in), (spec.linear.d_in, d)))
        op.backward_matmul_flops = op.matmul_flops
        cls = self.own(f"{spec.path}.cls_token", d)
        op.params += cls
        op.embedding_params = cls  # [CLS] is a learned embedding; the projection is a layer like any Linear
        self.add(Op(name=f"{spec.path}.cls", kind="embedding", layer=None, phase="forward", stack=stack,
                    shapes=f"[CLS] + [{B}, {spec.grid * spec.grid}, {d}]", bytes_read=(n_patches + d) * a,
                    bytes_written=rows * d * a))

    def embed(self, st: Stack, t: Tokens, rows: int) -> None:
        """Token lookup (+ segment table) (+ position table). The token table's parameters belong
        to the first stack that looks it up (an encoder-decoder's decoder shares the encoder's)."""
        c, a, wb = self.c, self.a, self.wb
        tok, *added = st.tables
        V, d = tok.shape
        own = 0 if tok.path in self.owned else V * d
        self.owned.add(tok.path)
        row = d * wb  # a float row, or one row of the LM head's blocks (a table read from a quantized tied head)
        if tok.layout:
            row = linear_weight_bytes(Linear(tok.path, "embedding", d, 1, False, layout=tok.layout,
                                             group=BLOCK_GROUPS[tok.layout]), wb)
        self.add(Op(name=tok.path, kind="embedding", layer=None, phase="forward", stack=st.name,
                    shapes=f"[{rows}] ids -> [{rows}, {d}] from [{V}, {d}]" + (f" {tok.layout}" if tok.layout else ""),
                    other_flops=rows * d if c.scale_embeddings else 0,
                    bytes_read=rows * INDEX_BYTES + rows * row, bytes_written=rows * d * a,
                    params=own, embedding_params=own, weight_bytes=rows * row))
        for table in added:  # looked up and added to the running sum
            n = table.shape[0] * d
            self.add(Op(name=table.path, kind="embedding", layer=None, phase="forward", stack=st.name,
                        shapes=f"[{rows}] ids -> [{rows}, {d}] from [{table.shape[0]}, {d}]", other_flops=rows * d,
                        bytes_read=rows * INDEX_BYTES + rows * d * wb + rows * d * a, bytes_written=rows * d * a,
                        params=n, embedding_params=n, weight_bytes=rows * d * wb))

    def enter(self, st: Stack, t: Tokens, rows: int) -> None:
        """What the first layer's input gets after the lookup: positions (a table added, or a score bias built
        once), the embedding norm, dropout, ALBERT's projection."""
        c, a, wb = self.c, self.a, self.wb
        d = st.tables[0].shape[1] if st.tables else st.patches.d  # ALBERT's tables are E wide
        pos = st.positions
        if pos.added:
            n = pos.table.shape[0] * d if pos.table.trained else 0
            self.add(Op(name=pos.path, kind="position", layer=None, phase="forward", stack=st.name,
                        shapes=f"[{rows}, {d}] + table[{pos.table.shape[0]}, {d}]", other_flops=rows * d,
                        bytes_read=rows * d * (a + (wb if pos.table.trained else 4)), bytes_written=rows * d * a,
                        params=n, embedding_params=n, weight_bytes=rows * d * wb if n else 0))
        elif pos.score_bias:
            # One (1, H, Tq, Tk) bias per forward pass, shared by every layer of the stack.
            elems = c.n_heads * t.tq * t.tk
            n = pos.table.shape[0] * pos.table.shape[1] if pos.table else 0
            self.add(Op(name=pos.path, kind="position", layer=None, phase="forward", stack=st.name,
                        shapes=f"[1, {c.n_heads}, {t.tq}, {t.tk}]", other_flops=elems, bytes_read=n * wb,
                        bytes_written=elems * a, params=n, embedding_params=0, weight_bytes=n * wb))
        if st.embed_norm:
            self.norm(st.embed_norm, None, st.name, rows)
        mask = self.dropout_mask(c.dropout, rows * d)
        if mask:
            self.ops[-1].saved_bytes += mask
        if st.embed_proj:  # ALBERT: width E -> d_model
            self.linear(st.embed_proj, None, st.name, rows)

    def attention(self, att: Attention, i: int, st: Stack, t: Tokens, rows: int) -> None:
        w, a = self.w, self.a
        B, H, Hkv, dh = w.batch, att.heads, att.kv_heads, att.head_dim
        cross = att.cross
        tq, tk = t.tq, (t.cross_keys if cross else t.tk)
        self.norm(att.norm, i, st.name, rows)
        q = self.linear(att.q, i, st.name, rows)
        if not (cross and t.cross_cached):  # decode: the encoder output's K and V were projected once and cached
            # k and v read the same input as q (self) or the encoder output (cross, kept once).
            kv_rows = B * tk if cross else rows
            k = self.linear(att.k, i, st.name, kv_rows, saves_input=cross and i == 0)
            v = self.linear(att.v, i, st.name, kv_rows, saves_input=False)
            if not cross:
                self.one_product([(q, att.q), (k, att.k), (v, att.v)])
        if att.q_norm:  # per head, over head_dim: (rows x heads) vectors each
            self.norm(att.q_norm, i, st.name, rows * H)
            self.norm(att.k_norm, i, st.name, rows * Hkv)
        if att.rope:
            self.elementwise(att.path + ".rope", "rope", i, st.name, B * tq * (H + Hkv) * dh, O.ROPE_FLOPS_PER_ELEMENT,
                             shapes=f"q [{B}, {H}, {tq}, {dh}], k [{B}, {Hkv}, {tq}, {dh}]")
        # Query-key pairs the FLOP count charges: all of them (what the reference path computes),
        # or under 'causal' accounting only those the causal mask allows.
        pairs = tq * tk
        if w.attention_flops == "causal" and st.causal and not cross:
            pairs = tq * (tk - tq) + tq * (tq + 1) // 2
        masked = (st.causal and tq > 1) or st.positions.score_bias
        call = AttentionCall(
            path=att.path, layer=i, stack=st.name, batch=B, heads=H, kv_heads=Hkv, head_dim=dh, tq=tq, tk=tk,
            pairs=pairs, act_bytes=a, extra_flops=1 if masked and not cross else 0,
            # The K (or V) this layer holds in the KV cache; a bidirectional stack keeps none.
            cache_bytes=B * Hkv * tk * dh * a if self.keep_cache and st.causal else 0,
            dropout=self.c.attention_dropout if self.train else 0.0,
            causal=st.causal and not cross, options=self.c.attention_options(i),
        )
        costed = attention_rows(costed_kind(self.c, self.w, cross, i), call)
        forward = [self.add(op) for op in costed if op.phase == "forward"]
        # Rows in phase "recompute": work the kind's backward does again (tiled's Q K^T, chunked's
        # checkpointed chunks), placed before the backward of its last forward row, when training.
        if self.train and len(forward) < len(costed):
            self.redone[forward[-1].name] = [op for op in costed if op.phase != "forward"]
        self.linear(att.o, i, st.name, rows)
        if att.post_norm:
            self.norm(att.post_norm, i, st.name, rows)
        self.residual(att.path + ".residual", i, st.name, rows, att.o.d_out)

    def mlp(self, spec: MLP, i: int, stack: str, rows: int) -> None:
        c, a = self.c, self.a
        f, gated = spec.up.d_out, spec.gate is not None
        self.norm(spec.norm, i, stack, rows)
        up = self.linear(spec.up, i, stack, rows)
        if gated:
            gate = self.linear(spec.gate, i, stack, rows, saves_input=False)
            self.one_product([(gate, spec.gate), (up, spec.up)])
        elems = rows * f
        per = O.ACTIVATION_FLOPS_PER_ELEMENT[spec.activation] + (1 if gated else 0)  # + the gating multiply
        # Saved: the activation's input; gated also the up output and the activation output (for the product).
        saved = elems * a * (3 if gated else 1) + self.dropout_mask(c.activation_dropout, elems)
        self.elementwise(spec.path + ".act", "activation", i, stack, elems, per, reads=2 if gated else 1,
                         saved=saved, shapes=f"[{rows}, {f}] {spec.activation}" + (" * up" if gated else ""))
        self.linear(spec.down, i, stack, rows)
        if spec.post_norm:
            self.norm(spec.post_norm, i, stack, rows)
        self.residual(spec.path + ".residual", i, stack, rows, spec.down.d_out)

    def recurrent(self, spec: Recurrent, stack: str, t: Tokens, rows: int) -> None:
        """Per direction: the input projection of every token at once (one matmul, as cuDNN runs it), the
        hidden projection one step at a time (t.tq products of (B, h) x (h, G h), each reading W_hh and
        waiting for the last), and the gates' element-wise work. The state (h, and c for an LSTM) is the
        cache generation keeps."""
        a, wb, B, T = self.a, self.wb, self.w.batch, t.tq
        g, h = spec.gates * spec.d_hidden, spec.d_hidden
        for direction in range(spec.directions):
            sfx = spec.suffix(direction)
            self.linear(Linear(f"{spec.path}.weight_ih{sfx}", "rnn_input", spec.d_in, g, spec.bias), spec.index,
                        stack, rows)
            bias = g if spec.bias else 0
            self.add(Op(
                name=f"{spec.path}.weight_hh{sfx}", kind="rnn_hidden", layer=spec.index, phase="forward", stack=stack,
                shapes=f"{T} steps x " + O.matmul_label((B, h), (h, g)) + (" + bias" if spec.bias else ""),
                dims=MatMul(T, B, h, g), matmul_flops=O.matmul_flops(B, h, g, batch=T), other_flops=rows * bias,
                # Backward: both gradients at every step but the first, whose input (the zero initial state)
                # takes none; a decoder's initial state comes from the encoder and takes one.
                backward_matmul_flops=2 * O.matmul_flops(B, h, g, batch=T) - (0 if spec.state_grad
                                                                               else O.matmul_flops(B, g, h)),
                bytes_read=rows * h * a + T * (g * h + bias) * wb, bytes_written=rows * g * a,
                params=g * h + bias, weight_bytes=T * (g * h + bias) * wb, saved_bytes=rows * h * a))
            states = STATES[spec.cell]
            self.elementwise(
                f"{spec.path}.cell{sfx}", "rnn_gates", spec.index, stack, rows * h, CELL_FLOPS_PER_UNIT[spec.cell],
                reads=2 * spec.gates + states, saved=rows * (g + (states - 1) * h) * a,
                shapes=f"{T} steps x [{B}, {g}] {spec.cell} gates")
            if self.keep_cache:
                self.ops[-1].cache_bytes = states * B * h * a

    def bridge(self, spec: Bridge, stack: str, t: Tokens) -> None:
        """A bidirectional encoder's outputs (every source position) and final states to the decoder's width."""
        if spec.memory is not None:
            self.linear(spec.memory, spec.index, stack, self.w.batch * t.tq)
        self.linear(spec.state, spec.index, stack, spec.layers * spec.states * self.w.batch)

    def recurrent_attention(self, spec: RecurrentAttention, stack: str, t: Tokens) -> None:
        """The decoder's attention over S = t.cross_keys encoder outputs for T = t.tq steps (tformer.model.rnn_seq2seq):
        the keys' source-side projection once per source (not in a decode step: the cache holds it), then per step
        the scores (Bahdanau: W_s s, tanh, v; Luong: a product with the keys), softmax, context and (Luong) W_c."""
        a, B, T, S, h, i = self.a, self.w.batch, t.tq, t.cross_keys, spec.d_hidden, spec.index
        if spec.keys is not None and not t.cross_cached:
            self.linear(spec.keys, i, stack, B * S)
        if spec.kind == "bahdanau":
            self.linear(spec.query, i, stack, B * T)
            self.elementwise(f"{spec.path}.tanh", "activation", i, stack, B * T * S * h, 2, reads=2,
                             saved=B * T * S * h * a, shapes=f"tanh([{B}, {T}, 1, {h}] + [{B}, 1, {S}, {h}])")
            self.linear(spec.score, i, stack, B * T * S)
        else:
            self._bmm(f"{spec.path}.scores", "scores", i, stack, B, T, h, S)
        self.elementwise(f"{spec.path}.softmax", "softmax", i, stack, B * T * S, O.SOFTMAX_FLOPS_PER_ELEMENT,
                         saved=B * T * S * a, shapes=f"[{B}, {T}, {S}] over the source")
        last = self._bmm(f"{spec.path}.context", "context", i, stack, B, T, S, h)
        if spec.combine is not None:
            self.linear(spec.combine, i, stack, B * T)
            last = self.elementwise(f"{spec.path}.combine_tanh", "activation", i, stack, B * T * h, 1,
                                    saved=B * T * h * a, shapes=f"tanh([{B}, {T}, {h}])")
        if self.keep_cache:  # the cache keeps the memory and its keys (Luong-dot: the same tensor), the feed
            keys = 0 if spec.kind == "luong-dot" else B * S * h
            feed = B * h if spec.combine is not None and self.c.rnn_input_feeding else 0
            last.cache_bytes = (B * S * h + keys + feed) * a

    def _bmm(self, name, kind, layer, stack, batch, m, k, n) -> Op:
        """A batched product of activations (B, m, k) @ (B, k, n); both operands take a gradient."""
        a = self.a
        return self.add(Op(name=name, kind=kind, layer=layer, phase="forward", stack=stack,
                           shapes=O.matmul_label((batch, m, k), (batch, k, n)), dims=MatMul(batch, m, k, n),
                           matmul_flops=O.matmul_flops(m, k, n, batch=batch),
                           bytes_read=batch * (m * k + k * n) * a, bytes_written=batch * m * n * a,
                           saved_bytes=batch * (m * k + k * n) * a))

    def residual(self, name, i, stack, rows, d) -> None:
        elems = rows * d
        self.elementwise(name, "residual", i, stack, elems, 1, reads=2,
                         saved=self.dropout_mask(self.c.dropout, elems), shapes=f"[{rows}, {d}] + same")

    def heads(self, arch: Architecture, rows: int) -> None:
        B, d = self.w.batch, self.c.d_model
        if arch.pooler:  # on the first token of each sequence
            op = self.linear(arch.pooler, None, "", B)
            op.other_flops += B * d * O.ACTIVATION_FLOPS_PER_ELEMENT["gelu"]  # tanh, costed like gelu
        if arch.mlm_head:
            head = arch.mlm_head
            self.linear(head.dense, None, "", rows)
            e = head.dense.d_out  # d_model, or ALBERT's E
            self.elementwise(head.path + ".act", "activation", None, "", rows * e,
                             O.ACTIVATION_FLOPS_PER_ELEMENT[head.activation], saved=rows * e * self.a)
            self.norm(head.norm, None, "", rows)
            self.loss(self.linear(head.decoder, None, "", rows))
        if arch.pair_head:  # NSP / SOP: 2 classes from the pooled vector
            self.linear(arch.pair_head, None, "", B)
        if arch.lm_head:
            op = self.linear(arch.lm_head.linear, None, "", rows)
            if arch.lm_head.rescale:
                op.other_flops += rows * d  # hidden * d_model^-0.5 before the tied head (T5)
            if arch.lm_head.logits_bias:
                op.other_flops += rows * op.dims.n  # BART's logits bias (a buffer, not a parameter)
            if arch.lm_head.softcap:  # divide, tanh, multiply over every logit; tanh's output kept for backward
                self.elementwise("lm_head.softcap", "activation", None, "", rows * op.dims.n, 3,
                                 saved=rows * op.dims.n * self.a, shapes=f"[{rows}, {op.dims.n}] softcap")
            self.loss(op)
        if arch.classifier:
            self.task_head(arch, rows)
        if arch.contrastive:
            self.contrastive(arch.contrastive)

    def task_head(self, arch: Architecture, rows: int) -> None:
        """The classifier on one vector per sequence (a ViT's [CLS]; a sequence classifier's pooled vector: a
        masked mean costs one add per element and the division) or on every token (token classification; question
        answering's start and end scores, each then a cross-entropy over the sequence's T positions)."""
        B, d = self.w.batch, self.c.d_model
        if arch.task in ("token-classification", "question-answering"):
            op = self.linear(arch.classifier, None, "", rows)
        else:
            if arch.pooling == "mean":
                self.elementwise(arch.classifier.path + ".pool", "activation", None, "", rows * d, 1,
                                 saved=0, shapes=f"mean over the tokens of [{B}, {rows // max(B, 1)}, {d}]")
            op = self.linear(arch.classifier, None, "", B)
        if arch.task != "question-answering":
            self.loss(op)
            return
        T = rows // max(B, 1)
        self.cross_entropy("loss.start", B, T)
        self.cross_entropy("loss.end", B, T)

    def contrastive(self, head: Contrastive) -> None:
        """CLIP over a batch of N = B image-text pairs: both pooled vectors projected (N rows each), L2-normalised,
        the N x N similarity (every image against every text: N^2 logits, the batch's quadratic term), times
        exp(logit_scale); then cross-entropy along rows and along columns, each keeping N^2 fp32 log-probabilities
        for the backward."""
        a, N, p = self.a, self.w.batch, head.vision_proj.d_out
        self.linear(head.vision_proj, None, "", N)
        self.linear(head.text_proj, None, "", N)
        # ||x||: square, sum, sqrt (per row), divide: 3 FLOPs an element, both sides
        self.elementwise(head.path + ".normalize", "activation", None, "", 2 * N * p, 3, saved=2 * N * p * a,
                         shapes=f"2 x [{N}, {p}] / ||x||")
        self.add(Op(name=head.path + ".similarity", kind="similarity", layer=None, phase="forward", stack="",
                    shapes=O.matmul_label((N, p), (p, N)), dims=MatMul(1, N, p, N),
                    matmul_flops=O.matmul_flops(N, p, N), bytes_read=2 * N * p * a, bytes_written=N * N * a,
                    saved_bytes=2 * N * p * a))
        # The temperature: the module's own parameter, so its row carries the module's path.
        scaled = self.add(Op(name=head.path, kind="temperature", layer=None, phase="forward", stack="",
                             shapes=f"[{N}, {N}] x exp(logit_scale)", dims=MatMul(1, N, p, N), other_flops=N * N + 1,
                             bytes_read=N * N * a + self.wb, bytes_written=N * N * a,
                             params=self.own(head.logit_scale, 1), weight_bytes=self.wb, saved_bytes=N * N * a))
        self.loss(scaled, name="loss.image_to_text")
        self.loss(scaled, name="loss.text_to_image")

    def loss(self, logits: Op, name: str = "loss") -> None:
        """Cross-entropy over the logits ``logits`` writes (training only); an LM head's a chunk of rows at a time
        under the workload's loss_chunk."""
        if self.train and self.w.loss_chunk and logits.kind == "lm_head":
            self.chunked_cross_entropy(logits, name)
            return
        self.cross_entropy(name, logits.dims.m, logits.dims.n)

    def chunked_cross_entropy(self, logits: Op, name: str) -> None:
        """tformer.model.chunked_loss: the loss keeps each row's fp32 log-sum-exp, not its log-probabilities, and its
        backward first recomputes the head's matmul (and the softcap, whose output is then not kept either), a chunk
        of rows at a time. The chunk's working set is the logits' memory (tformer.cost.memory.logits_bytes)."""
        rows, V = logits.dims.m, logits.dims.n
        redone = [replace(logits, phase="recompute", params=0, embedding_params=0, saved_bytes=0)]
        if self.ops[-1].name == logits.name + ".softcap":
            cap = self.ops[-1]
            cap.saved_bytes = 0
            redone.append(replace(cap, phase="recompute"))
        self.add(Op(name=name, kind="loss", layer=None, phase="forward", stack="",
                    shapes=f"cross-entropy over [{rows}, {V}], {min(self.w.loss_chunk, rows)} rows at a time",
                    other_flops=rows * V * O.CROSS_ENTROPY_FLOPS_PER_LOGIT,
                    bytes_read=rows * V * self.a + rows * INDEX_BYTES, bytes_written=LOSS_BYTES,
                    saved_bytes=rows * LOSS_BYTES))  # the fp32 log-sum-exp of each row
        self.redone[name] = redone

    def cross_entropy(self, name: str, rows: int, V: int) -> None:
        """Cross-entropy over ``rows`` rows of ``V`` logits each (training only)."""
        if not self.train:
            return
        a = self.a
        self.add(Op(name=name, kind="loss", layer=None, phase="forward", stack="",
                    shapes=f"cross-entropy over [{rows}, {V}]", other_flops=rows * V * O.CROSS_ENTROPY_FLOPS_PER_LOGIT,
                    bytes_read=rows * V * a + rows * INDEX_BYTES, bytes_written=LOSS_BYTES,
                    saved_bytes=rows * V * LOSS_BYTES))  # the fp32 log-probabilities

    # Training ------------------------------------------------------------------------------------
    def backward_and_optimizer(self, skips: tuple[str, ...] = ()) -> None:
        """Backward: each matmul becomes two (gradient of the input and of the weight), so backward
        matmul FLOPs are exactly 2x forward (what FlopCounterMode counts; an op whose operand
        takes no gradient says so in backward_matmul_flops); element-wise backward work
        and bytes are taken as 2x forward (a convention). Checkpointing adds one recomputed forward
        of every layer; an attention kind's own recompute rows (``self.redone``) go before its backward.
        The optimizer touches every parameter once. ``skips``: name prefixes of ops the loss never
        reaches (no backward, no optimizer step)."""
        w = self.w
        forward = list(self.ops)
        reached = [op for op in forward if not op.name.startswith(skips)] if skips else forward
        if w.checkpointing:
            for op in forward:
                if op.layer is not None:
                    self.ops.append(replace(op, phase="recompute", params=0, embedding_params=0, saved_bytes=0,
                                            scores_bytes=0, cache_bytes=0))
        for op in reversed(reached):
            self.ops.extend(self.redone.get(op.name, ()))
            self.ops.append(backward_op(op))
        per_param = optimizer_bytes_per_param(w)
        flops_per = OPTIMIZER_FLOPS_PER_PARAM[w.optimizer]
        for op in reached:
            if op.params:
                self.ops.append(Op(
                    name=op.name, kind="optimizer", layer=op.layer, phase="optimizer", stack=op.stack,
                    shapes=f"{op.params} params ({w.optimizer})", other_flops=op.params * flops_per,
                    bytes_read=op.params * per_param["read"], bytes_written=op.params * per_param["written"]))
