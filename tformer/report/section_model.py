"""Section 2: the model — its configuration, parameters, FLOPs by op kind (exact, the 2N/6N rules
and the course's convention side by side) and memory for training and inference. Every number is
read off the ledger."""

from __future__ import annotations

from dataclasses import replace

from tformer.core import fmt
from tformer.cost.conventions import COURSE_WEIGHTS, course_flops
from tformer.cost.ledger import Workload, ledger
from tformer.cost.ops import KINDS
from tformer.cost.scaling import activation_alternatives
from tformer.report.doc import Section

CONFIG_FIELDS = ("arch", "n_layers", "n_decoder_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                 "vocab_size", "max_positions", "position", "norm", "norm_placement", "activation", "gated_mlp",
                 "bias", "tied_embeddings", "dropout", "attention_dropout")


def describe(w) -> str:
    text = f"{w.phase}: batch {w.batch} x {w.seq} tokens, {w.dtype}"
    if w.phase == "decode":
        text = f"decode: one new token per sequence, batch {w.batch}, context {w.decode_context}, {w.dtype}"
    if w.training:
        text += f", {w.optimizer}"
    return text


def _by_kind(lg) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for op in lg.ops:
        row = out.setdefault(op.kind, {"matmul": 0, "other": 0})
        row["matmul"] += op.matmul_flops
        row["other"] += op.other_flops
    return out


def _course_note() -> str:
    parts = [f"{k} x{w:g}" for k, w in COURSE_WEIGHTS.items() if w != 1]
    return ("the course assignment's per-layer formula (20·T·d² + 4·T²·d) reweights the ledger's forward matmuls by "
            f"kind ({', '.join(parts)}; the rest x1): projections counted in multiply-accumulates, the FFN and "
            "attention in FLOPs, no LM head — it mixes units")


def build(ctx) -> Section:
    sec = Section(2, "The model", "model")
    c = ctx.config
    lf, lt = ctx.ledgers["forward"], ctx.ledgers["train"]
    sec.text(f"Model **{getattr(c, 'name', 'custom')}** ({c.arch}). Workloads analysed: "
             + "; ".join(f"`{describe(w)}`" for w in ctx.workloads.values()) + ".")
    sec.table(["field", "value"], [[f, str(getattr(c, f))] for f in CONFIG_FIELDS if hasattr(c, f)],
              caption="Configuration")

    p = lf.params
    rows = [["total", fmt.params(p["total"])], ["embedding (token, type, position tables)", fmt.params(p["embedding"])],
            ["non-embedding", fmt.params(p["non_embedding"])]]
    rows += [[f"component: {comp}", fmt.params(n)] for comp, n in p["by_component"].items()]
    sec.table(["parameters", "count"], rows, caption="Parameters by component (every tensor once; tied embeddings once)")

    kf, kt = _by_kind(lf), _by_kind(lt)
    kinds = [k for k in KINDS if k in kf or k in kt]
    rows = []
    for k in kinds:
        f, t = kf.get(k, {"matmul": 0, "other": 0}), kt.get(k, {"matmul": 0, "other": 0})
        rows.append([k, fmt.count(f["matmul"]), fmt.count(f["other"]), fmt.count(t["matmul"]), fmt.count(t["other"])])
    rows.append(["**total**", fmt.count(lf.flops["matmul"]), fmt.count(lf.flops["other"]),
                 fmt.count(lt.flops["matmul"]), fmt.count(lt.flops["other"])])
    wf, wt = ctx.workloads["forward"], ctx.workloads["train"]
    sec.table(["op kind", "forward matmul FLOPs", "forward other FLOPs", "train-step matmul FLOPs",
               "train-step other FLOPs"], rows,
              caption=f"FLOPs by op kind: one forward pass ({describe(wf)}) and one training step "
                      f"(forward + backward + optimizer, {describe(wt)})")
    sec.text(f"One forward pass: **{fmt.flops(lf.flops['total'])}** in total, of which "
             f"{fmt.flops(lf.flops['matmul'])} in matmuls. One training step: **{fmt.flops(lt.flops['total'])}** "
             f"({fmt.flops(lt.flops['matmul'])} in matmuls): "
             + ", ".join(f"{ph} {fmt.flops(v['total'])}" for ph, v in lt.flops["by_phase"].items()) + ".")

    rf, rt = lf.rules_of_thumb, lt.rules_of_thumb
    course = course_flops(lf)
    sec.table(["count", "forward", "training step"], [
        ["exact (ledger matmul FLOPs)", fmt.flops(rf["exact_matmul"]), fmt.flops(rt["exact_matmul"])],
        [f"rule of thumb ({rf['rule']} / {rt['rule']}, N = {fmt.count(rf['N'])} non-embedding params, "
         f"D = {fmt.count(rf['D'])} tokens)", fmt.flops(rf["value"]), fmt.flops(rt["value"])],
        ["exact / rule", fmt.ratio(rf["ratio_exact_over_rule"]), fmt.ratio(rt["ratio_exact_over_rule"])],
        ["course assignment's convention (mixes MACs and FLOPs)", fmt.flops(course), "—"],
    ], caption="The exact count beside the rules of thumb and the course's convention")
    sec.bullets([f"forward: {rf['explanation']}", f"training: {rt['explanation']}", _course_note()])

    # Memory: training.
    m = lt.memory
    rows = [[k, fmt.nbytes(m[k])] for k in ("weights", "gradients", "optimizer", "activations", "logits", "total")]
    sec.table(["training memory", "bytes"], rows,
              caption=f"Training memory for {describe(wt)}: recipe {m['recipe']}, bytes per parameter "
                      + ", ".join(f"{k} {v}" for k, v in m["bytes_per_param"].items()) + f"; total = {m['total_rule']}")
    alts = activation_alternatives(ctx.config, wt)
    sec.table(["activations kept for backward", "bytes"], [[k, fmt.nbytes(v)] for k, v in alts.items()],
              caption=f"Activation memory with and without checkpointing and a materialised s×s score matrix "
                      f"({m['activation_rule']})")

    # Memory: inference, KV cache against context.
    if "decode" in ctx.workloads:
        seq = ctx.workloads["decode"].seq
        contexts = sorted({max(1, seq // 8), max(1, seq // 4), max(1, seq // 2), seq - 1})
        rows = []
        for n in contexts:
            lg = ledger(ctx.config, Workload(phase="decode", batch=1, seq=n + 1, context=n))
            mm = lg.memory
            rows.append([str(n), fmt.nbytes(mm["weights"]), fmt.nbytes(mm["kv_cache"]), fmt.nbytes(mm["total"])])
        per_token = ctx.ledgers["decode"].memory["kv_cache_per_token"]
        sec.table(["context n", "weights", "KV cache", "inference total"], rows,
                  caption=f"Inference memory (batch 1, fp32) for one decode step at context n: KV cache = "
                          f"{fmt.count(per_token)} B per token (2 x layers x kv_heads x head_dim x bytes), for the n "
                          "cached tokens and the new one")
        for dtype in ("bf16", "int8"):
            lg = ledger(ctx.config, replace(ctx.workloads["decode"], dtype=dtype))
            how = lg.conventions()["dtype"]
            sec.text(f"In {dtype}{f' ({how})' if how != dtype else ''}: weights {fmt.nbytes(lg.memory['weights'])}, KV cache "
                     f"{fmt.nbytes(lg.memory['kv_cache'])} at context {ctx.workloads['decode'].decode_context}.")

    ctx.data["model"] = {
        "name": getattr(c, "name", "custom"), "arch": c.arch,
        "workloads": {k: {f: getattr(w, f) for f in w.__dataclass_fields__} for k, w in ctx.workloads.items()},
        "params": p, "flops_forward": lf.flops, "flops_train": lt.flops,
        "rules_of_thumb": {"forward": rf, "train": rt}, "course_flops_forward": course,
        "memory_train": {k: v for k, v in m.items() if k != "activations_per_layer"},
        "activation_alternatives": alts,
        "kv_cache": ctx.ledgers["decode"].memory["kv_cache"] if "decode" in ctx.ledgers else 0,
        "kv_cache_per_token": ctx.ledgers["decode"].memory["kv_cache_per_token"] if "decode" in ctx.ledgers else 0,
        "conventions": lt.conventions(),
    }
    return sec
