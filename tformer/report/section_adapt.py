"""Section 13: adapting and compressing. The ledger's part is always shown (no torch, no measurement): for the
report's model given a 2-class head, what each fine-tuning method trains and the training memory it predicts
(tformer.cost.peft), and for a model that decodes, the weight bytes of int8 and int4 and the decode time the
roofline predicts for each on the report's device. The measured part is read from the latest records the benches
filed for this CPU (bench/finetune.py, quantize.py, distill.py, prune.py, export.py); without one, a line names the
command that makes it. Nothing is trained or timed while the report runs.
"""

from __future__ import annotations

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.core.peft import PeftSpec
from tformer.cost.ledger import Workload, ledger
from tformer.cost.peft import added_parameters, trainable_parameters, training_memory
from tformer.cost.roofline import roofline
from tformer.report.doc import Section
from tformer.report.section_long_context import MALFORMED, RESULTS_DIR, bench_record

QUANTIZED = (("fp32", {}), ("int8", {"quantize": "int8"}), ("int4 g32", {"quantize": "int4", "quant_group": 32}),
             ("int4 g128", {"quantize": "int4", "quant_group": 128}))


def methods(d_model: int) -> list[tuple[str, PeftSpec]]:
    """The fine-tuning methods the section costs (an adapter's bottleneck no wider than the model)."""
    return [("full", PeftSpec(method="full")), ("head only", PeftSpec(method="head")),
            ("BitFit", PeftSpec(method="bitfit")), ("LoRA r=8 (q, v)", PeftSpec(method="lora", rank=8)),
            ("adapters", PeftSpec(method="adapter", bottleneck=min(64, max(d_model // 4, 1)))),
            ("prompt (20 tokens)", PeftSpec(method="prompt")), ("prefix (20 tokens)", PeftSpec(method="prefix"))]


def classifier(config):
    """The report's model as a fine-tuning run would hold it: a 2-class sequence classifier (a ViT keeps its own
    head); None for the architectures the fine-tuning methods do not take."""
    if config.task or config.traits.vision_only:
        return config
    if config.traits.text_encoder or config.traits.decoder_only:
        return config.replace(task="sequence-classification", n_classes=2)
    return None


def peft_rows(config, workload: Workload) -> tuple[list[dict], list[str]]:
    """The costed methods, and a line for each one this config cannot take (prompt tuning past max_positions,
    prefix tuning on shared layers)."""
    rows, skipped = [], []
    full = None
    for label, spec in methods(config.d_model):
        try:
            memory = training_memory(config, spec, workload)
        except TformerError as exc:
            skipped.append(f"{label}: {exc}")
            continue
        full = full or memory["total"]
        rows.append({"method": label, "trainable": trainable_parameters(config, spec),
                     "added": added_parameters(config, spec), "memory": memory, "vs_full": memory["total"] / full})
    return rows, skipped


def quantized_rows(config, device, context: int) -> list[dict]:
    """Weight bytes and the roofline's decode step at batch 1 for each weight format ``config`` can take."""
    rows = []
    for label, change in QUANTIZED:
        try:
            c = config.replace(**change) if change else config
            book = ledger(c, Workload(phase="decode", batch=1, seq=context + 1, context=context))
        except TformerError:  # a group that does not divide a layer's width
            continue
        rows.append({"format": label, "weight_bytes": book.memory["weights"],
                     "decode_s": roofline(book, device).time_s})
    for r in rows:
        r["speedup"] = rows[0]["decode_s"] / r["decode_s"] if r["decode_s"] else None
    return rows


def build(ctx) -> Section:
    sec = Section(13, "Adapting and compressing", "adapt")
    data: dict = {}
    config = ctx.config
    task = classifier(config)
    if task is not None:
        workload = Workload(phase="train", batch=ctx.options.batch or 8,
                            seq=min(ctx.options.seq or 128, config.max_positions))
        rows, skipped = peft_rows(task, workload)
        total = rows[0]["trainable"] if rows else 0
        data["peft"] = {"config": task.name, "batch": workload.batch, "seq": workload.seq, "rows": rows,
                        "skipped": skipped}
        sec.text("Fine-tuning need not train every weight. Frozen weights take no gradient and no optimizer state "
                 "(Adam keeps two moments per trained parameter), and a frozen Linear need not keep its input for "
                 "the backward pass; what the method adds (LoRA's A and B, an adapter's bottleneck, prompt or prefix "
                 "positions) trains, and so does the task head.")
        sec.table(["method", "trains", "added", "training memory", "vs full"],
                  [[r["method"], f"{fmt.count(r['trainable'])} ({r['trainable'] / total:.2%})",
                    fmt.count(r["added"]), fmt.si(r["memory"]["total"], "B"), f"{r['vs_full']:.2f}x"] for r in rows],
                  caption=f"Predicted by the ledger (tformer.cost.peft) for this model with a 2-class head, training "
                          f"at batch {workload.batch} x {workload.seq} tokens with AdamW")
        for line in skipped:
            sec.text(f"Not costed here: {line}.")
    else:
        sec.text(f"This model is {config.traits.label}; the fine-tuning methods take encoders, decoders and ViTs.")
    if config.traits.decoder_only:
        context = min(config.max_positions - 1, ctx.options.seq or 128)
        rows = quantized_rows(config, ctx.target, context)
        data["quantize"] = {"context": context, "device": ctx.target.name, "rows": rows}
        sec.text("Decoding one token at a time reads every weight once per token, so its time follows the weight "
                 "bytes: int8 stores one byte a weight plus a scale per output row, int4 half a byte plus a scale "
                 "and a zero point per group of inputs. The roofline predicts the step from those bytes; whether a "
                 "kernel reaches it is what bench/quantize.py measures.")
        sec.table(["weights", "bytes", "decode step (predicted)", "speed-up"],
                  [[r["format"], fmt.si(r["weight_bytes"], "B"), fmt.seconds(r["decode_s"]),
                    fmt.ratio(r["speedup"]) if r["speedup"] else "-"] for r in rows],
                  caption=f"Predicted on {ctx.target.name}: one decode step at batch 1 with {context} tokens cached")
    _measured(sec, ctx, data)
    ctx.data["adapt"] = data
    return sec


# The benches' records: (record name, key it must hold, command, how its table is read)
def _finetune(r):
    return (["method", "trains", "memory predicted", "measured", "time/step", "held-out accuracy"],
            [[x["method"], fmt.count(x["trainable_parameters"]), fmt.si(x["predicted_peak_bytes"], "B"),
              fmt.si(x["measured_peak_bytes"], "B"), fmt.seconds(x["step_s"]), f"{x['test_accuracy']:.1%}"]
             for x in r["rows"]],
            (f"all-MiniLM-L6-v2 fine-tuned on Shakespeare vs Milton lines ({r['steps']} steps of {r['batch']}); "
             "accuracy on lines from passages never seen in training"))


def _quantize(r):
    return (["variant", "bytes", "decode tokens/s", "speed-up", "predicted", "char val loss"],
            [[x["variant"], fmt.si(x["bytes"], "B"), f"{x['tokens_per_s']:.2f}", fmt.ratio(x["speedup"]),
              fmt.ratio(x["predicted_speedup"]) if x.get("predicted_speedup") else "-", f"{x['val_loss']:.4f}"]
             for x in r["rows"]],
            "gpt2 (124M) decode at batch 1, and a char model's validation loss, by weight format")


def _distill(r):
    t = r["teacher"]
    rows = [["teacher", t["config"], f"{t['val_loss']:.3f}"]]
    rows += [[f"student ({s['student']})", r["student_config"], f"{s['val_loss']:.3f}"] for s in r["students"]]
    return (["model", "size", "val loss"], rows,
            f"Distillation: a student from every other teacher layer, {r['settings']['steps']} steps each")


def _prune(r):
    rows = [[f"{x['scope']} {x['sparsity']:.0%}", fmt.count(x["params"]), fmt.ratio(x["forward_speedup"]),
             f"{x['val_loss']:.3f}"] for x in r["unstructured"]]
    rows += [[f"-{x['heads_removed']} heads, -{x['ffn_removed']:.0%} FFN ({x['importance']})", fmt.count(x["params"]),
              fmt.ratio(x["forward_speedup"]), f"{x['val_loss']:.3f}"] for x in r["structured"]]
    return (["pruning", "parameters", "forward speed-up", "val loss"], rows,
            f"Pruning {r['model']}: zeroed weights keep their shapes (no speed-up); removed heads and neurons do")


def _export(r):
    return (["model", "batch x length", "PyTorch", "ONNX Runtime", "speed-up"],
            [[m["model"], f"{s['batch']} x {s['length']}", fmt.seconds(s["eager_s"]), fmt.seconds(s["ort_s"]),
              fmt.ratio(s["speedup"])] for m in r["models"] for s in m["shapes"]],
            f"One forward pass, ONNX Runtime against PyTorch eager, {r['threads']} thread(s) each")


BENCHES = (("finetune", "rows", "python bench/finetune.py", _finetune),
           ("quantize", "rows", "python bench/quantize.py", _quantize),
           ("distill", "students", "python bench/distill.py", _distill),
           ("prune", "structured", "python bench/prune.py", _prune),
           ("export", "models", "python bench/export.py", _export))


def _measured(sec: Section, ctx, data: dict) -> None:
    measured, missing = {}, []
    for name, needs, command, read in BENCHES:
        record, source = bench_record(ctx.specs.cpu, name, f"{name} record", command, needs, RESULTS_DIR)
        if record is None:
            missing.append(source)
            continue
        try:
            headers, rows, caption = read(record)
        except MALFORMED as exc:
            missing.append(f"the {name} record ({source}) is malformed ({type(exc).__name__}: {exc}); rerun `{command}`")
            continue
        sec.table(headers, rows, caption=f"Measured on this CPU ({source}): {caption}")
        measured[name] = {"source": source, "record": record}
    for line in missing:
        sec.text(f"Measured: {line}.")
    data["measured"] = {**measured, "missing": missing}
