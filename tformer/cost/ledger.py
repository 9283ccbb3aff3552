"""The ledger: (config, workload) -> the list of ops a forward pass, training step, prefill or decode
step performs, in the order the model runs them. Every total is a sum over that list.

The op list mirrors tformer/model because both read one description of the architecture
(tformer.cost.architecture); tformer.cost.oplist walks it. Nothing is allocated; it is arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.errors import TformerError
from tformer.cost import ops as O
from tformer.cost.architecture import Architecture, describe
from tformer.cost.attention import costed_kind
from tformer.cost.conventions import conventions
from tformer.cost.memory import memory_breakdown
from tformer.cost.oplist import OpListBuilder, stack_tokens
from tformer.cost.ops import Op
from tformer.cost.recurrent import recurrent_summary
from tformer.cost.recurrent_attention import rnn_seq2seq_summary
from tformer.cost.rules import rules_of_thumb
from tformer.cost.workload import ACTIVATION_BYTES, Workload

_PROJECTION_KINDS = ("qkv_proj", "out_proj", "norm", "residual", "rope")  # around the attention core, not in it
# The ledger's counts are exact integers, but times, ratios and prices are floats made from them: a count past
# this (a d_model of 1e308 through --set, a 400-digit --batch) would reach float64's end as inf or an
# OverflowError. No machine comes within 40 orders of magnitude of it.
MAX_COUNT = 10 ** 100
_COUNTED = ("matmul_flops", "other_flops", "bytes_read", "bytes_written", "params", "saved_bytes", "cache_bytes")


@dataclass
class Ledger:
    config: object
    workload: Workload
    ops: list[Op] = field(default_factory=list)

    @cached_property
    def architecture(self) -> Architecture:
        return describe(self.config)

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
        """total, embedding (token, token-type and position tables), non_embedding, per component, and
        trained: those the training loss reaches (all but BERT's pooler under the masked-token loss)."""
        fwd = [op for op in self._param_source().ops if op.phase == "forward"]
        skips = self.architecture.loss_skips
        by_component: dict[str, int] = {}
        for op in fwd:
            if op.params:
                comp = _component(op)
                by_component[comp] = by_component.get(comp, 0) + op.params
        total = self.total(fwd, "params")
        embedding = self.total(fwd, "embedding_params")
        untrained = sum(op.params for op in fwd if skips and op.name.startswith(skips))
        return {"total": total, "embedding": embedding, "non_embedding": total - embedding, "trained": total - untrained,
                "by_component": by_component}

    def _param_source(self) -> Ledger:
        """The op list that holds every parameter once. A decode step of an encoder-decoder does
        not run the encoder, yet its weights are in memory: count them from a forward op list."""
        if any(stack_tokens(st, self.workload) is None for st in self.architecture.stacks):
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
        w = self.workload
        runs = [stack_tokens(st, w) for st in self.architecture.stacks]
        return sum(w.batch * t.tq for t in runs if t is not None)

    @cached_property
    def rules_of_thumb(self) -> dict:
        return rules_of_thumb(self)

    @cached_property
    def memory(self) -> dict:
        return memory_breakdown(self)

    def conventions(self) -> dict:
        return conventions(self.workload)

    # Attention -------------------------------------------------------------------------------
    @cached_property
    def attention(self) -> dict:
        """The self-attention kind in force and what its core rows (between the projections) cost:
        forward FLOPs, bytes moved, the largest per-layer scores tensor and what is saved for backward."""
        c = self.config
        name = costed_kind(c, self.workload)
        kind = ATTN_KINDS[name]
        paths = {a.path for st in self.architecture.stacks for layer in st.layers for a in layer.attention if not a.cross}
        core, per_layer = [], {}
        for op in self.ops:
            path = op.name.rsplit(".", 1)[0]
            if op.phase == "forward" and path in paths and op.kind not in _PROJECTION_KINDS:
                core.append(op)
                per_layer[path] = per_layer.get(path, 0) + op.bytes_written
        return {"kind": name, "family": kind.family, "computed": kind.computed,
                "options": {name: getattr(c, name) for name in kind.options},
                "matmul_flops": self.total(core, "matmul_flops"), "other_flops": self.total(core, "other_flops"),
                "bytes": self.total(core, "bytes_read") + self.total(core, "bytes_written"),
                "written_per_layer": max(per_layer.values(), default=0),
                "saved": self.total(core, "saved_bytes"), "scores_saved": self.total(core, "scores_bytes")}

    @cached_property
    def recurrent(self) -> dict | None:
        """An RNN's figures (parameters in both conventions, FLOPs per step, state bytes, sequential
        steps against an attention layer's one); None for a Transformer."""
        if not self.config.traits.recurrent:
            return None
        w = self.workload
        if self.config.arch == "rnn-seq2seq":
            target = 1 if w.phase == "decode" else w.seq_decoder or w.seq
            return rnn_seq2seq_summary(self.config, w.seq, target, w.batch, ACTIVATION_BYTES[w.dtype])
        return recurrent_summary(self.config, 1 if w.phase == "decode" else w.seq, w.batch, ACTIVATION_BYTES[w.dtype])

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
            "attention": self.attention,
        }
        if w.phase == "decode":
            d["workload"]["context"] = w.decode_context
        if self.recurrent is not None:
            d["recurrent"] = self.recurrent
        if include_ops:
            d["ops"] = [op.to_dict() for op in self.ops]
        return d


def _component(op: Op) -> str:
    if op.kind in ("qkv_proj", "out_proj"):
        return "cross_attention" if ".cross_attn." in op.name else "attention"
    if op.kind in ("ffn_up", "ffn_gate", "ffn_down"):
        return "ffn"
    if op.kind in ("rnn_input", "rnn_hidden"):
        return "recurrent"
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
    arch = describe(config)
    _check(config, arch, workload)
    lg = Ledger(config, workload, OpListBuilder(config, workload).build(arch))
    _check_counts(lg)
    return lg


def _check_counts(lg: Ledger) -> None:
    for attr in _COUNTED:
        total = lg.total(lg.ops, attr)
        if total > MAX_COUNT:
            raise TformerError(f"this model and workload come to {len(str(total))}-digit {attr} per step, beyond the "
                               f"1e100 the ledger computes with (float64 ends at 1.8e308); use smaller sizes "
                               f"(d_model, n_layers, vocab_size, --batch, --seq)")


def _check(config, arch: Architecture, w: Workload) -> None:
    if w.phase not in config.traits.phases:
        raise TformerError(f"{config.traits.label} does not generate, so phase '{w.phase}' does not apply; "
                           f"use {' or '.join(config.traits.phases)}")
    if w.training and w.loss_chunk and not (config.traits.decoder_only and arch.lm_head):
        # What the model offers (tformer.model.runners.DecoderRunner.chunk_loss): the ledger costs nothing else.
        raise TformerError(f"loss_chunk applies to a decoder-only language model's LM head; {config.traits.label}"
                           f"{' with a task head' if arch.classifier else ''} trains another loss; leave it at 0")
    if config.position in ("learned", "sinusoidal") and any(st.tables for st in arch.stacks):  # a ViT reads no seq
        need = {"decode": w.decode_context + 1}.get(w.phase, max(w.seq, w.seq_decoder or 0))
        if need > config.max_positions:
            raise TformerError(
                f"{need} positions exceed the model's max_positions={config.max_positions} "
                f"({config.position} position table); use a shorter --seq/--context or raise max_positions"
            )
