"""`tformer count`: the ledger of a model and workload — parameters, FLOPs, memory, and with
--hardware the roofline time of every op."""

import json
import math
from dataclasses import replace

from tformer.cli._cost_common import (
    LAYOUT_NUMBERS,
    MAX_SIZE,
    WORKLOAD_NUMBERS,
    add_layout_arguments,
    add_model_arguments,
    add_workload_arguments,
    console,
    layout_summary,
    load_config,
    load_device,
    load_layout,
    load_workload,
)
from tformer.cli._count_images import (
    add_image_arguments,
    fusion_table,
    image_request,
    image_summary,
    print_image_header,
    size_table,
)
from tformer.cli._parallel_print import print_parallel
from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds
from tformer.core.objectives import OBJECTIVES, objective_config
from tformer.cost.conventions import course_flops
from tformer.cost.ledger import ledger
from tformer.cost.vocabulary import vocabulary_memory, vocabulary_shares
from tformer.cost.roofline import roofline
from tformer.cost.scaling import activation_alternatives

NAME = "count"
HELP = "Count parameters, FLOPs, memory and (with --hardware) time, op by op, for a model and workload."
NUMBERS = {**WORKLOAD_NUMBERS, **LAYOUT_NUMBERS, "cross_every": Bounds(1, MAX_SIZE, integer=True)}


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    add_workload_arguments(parser)
    add_layout_arguments(parser)
    add_image_arguments(parser)
    parser.add_argument("--ops", action="store_true", help="print the per-op table")
    parser.add_argument("--convention", choices=["exact", "course"], default="exact",
                        help="course: also show the course assignment's per-layer count beside the exact one")
    parser.add_argument("--objective", metavar="NAME",
                        help=f"count the model `tformer train --objective NAME` builds ({' | '.join(OBJECTIVES)}): "
                             "its extra heads and added ids, for a tokenizer with no special ids")


def run(args) -> int:
    config, sizes = image_request(args, load_config(args))
    workload = load_workload(args, config)
    added = None
    if args.objective:
        base = ledger(config, workload)
        config = objective_config(args.objective, config, workload.seq)
        added = _objective_adds(args.objective, base, ledger(config, workload))
    device = load_device(args.hardware)
    lg = ledger(config, workload)
    roof = roofline(lg, device, args.efficiency) if device is not None else None
    if args.efficiency != 1.0 and device is None:
        raise TformerError("--efficiency scales the roofline; give --hardware too")
    alternatives = activation_alternatives(config, workload)
    unchunked = _without_loss_chunk(config, workload)
    course = course_flops(lg) if args.convention == "course" else None
    layout = load_layout(args, config, workload)
    par = layout_summary(args, config, workload, layout, device, roof)

    if args.json:
        out = lg.to_dict(include_ops=True)
        if alternatives:
            out["memory"]["activations_alternatives"] = alternatives
        out["memory"].update(vocabulary_memory(lg))
        vocab = vocabulary_shares(config, workload)
        if vocab is not None:
            out["vocabulary"] = vocab
        if unchunked is not None:
            out["memory"]["without_loss_chunk"] = unchunked
        if course is not None:
            out["flops"]["course_assignment"] = course
            out["conventions"]["course_assignment"] = _COURSE_NOTE
        out["memory"]["per_device"] = par["per_device"]
        if added is not None:
            out["objective"] = added
        if config.traits.images:
            out["image"] = image_summary(lg)
            if sizes is not None:
                out["image_sizes"] = size_table(None, config, workload, sizes)
            if args.fusion:
                out["fusion"] = fusion_table(None, config, workload, args.cross_every)
        for key in ("layout", "communication", "pipeline", "time", "devices_needed"):
            if key in par:
                out["parallel_time" if key == "time" else key] = par[key]
        if roof is not None:
            rd = roof.to_dict()
            out["time_s"] = roof.time_s
            out["roofline"] = {k: v for k, v in rd.items() if k != "ops"}
            for op, t in zip(out["ops"], roof.ops):
                op["time_s"], op["bound"], op["attainable_flops"] = t.time_s, t.bound, t.attainable_flops
        print(json.dumps(out, indent=1))
        return 0
    if added is not None:
        console().print(f"objective [bold]{added['name']}[/]: {added['changes']}; adds "
                        f"{fmt.params(added['params'], word=True)} and {fmt.flops(added['flops'])} per step "
                        f"({fmt.flops(added['matmul_flops'])} matmul)")
    _print_tables(lg, roof, alternatives, course, args.ops, unchunked)
    vocab = vocabulary_shares(config, workload)
    if vocab is not None:
        _print_vocabulary(console(), vocab)
    if sizes is not None:
        size_table(console(), config, workload, sizes)
    if args.fusion:
        fusion_table(console(), config, workload, args.cross_every)
    if not layout.single or "devices_needed" in par:
        print_parallel(par, workload)
    return 0


def _without_loss_chunk(config, workload) -> dict | None:
    """With --loss-chunk, the same training step's memory with the whole logits at once, to set beside it."""
    if not (workload.training and workload.loss_chunk):
        return None
    plain = ledger(config, replace(workload, loss_chunk=0))
    m = plain.memory
    return {"logits": m["logits"], "activations": m["activations"], "total": m["total"], **vocabulary_memory(plain)}


def _print_vocabulary(con, v: dict) -> None:
    from rich.table import Table  # deferred: --json output never loads rich

    t = Table(title="The vocabulary's share (token table and LM head)")
    t.add_column("of")
    t.add_column("share", justify="right")
    t.add_row("parameters (the token table)", f"{v['embedding_params_share']:.1%} ({fmt.params(v['embedding_params'])})")
    t.add_row("matmul FLOPs of a training step (the LM head)", f"{v['head_flops_share_train']:.1%}")
    t.add_row("matmul FLOPs of a decoded token (the LM head)", f"{v['head_flops_share_decode']:.1%}")
    t.add_row("bytes a decode step reads (table row + head)", f"{v['head_bytes_share_decode']:.1%}")
    b, s = v["train_batch_seq"]
    t.add_row(f"training memory at {b} x {s} (logits + what the loss keeps)", f"{v['logits_memory_share_train']:.1%}")
    con.print(t)


def _objective_adds(name: str, base, trained) -> dict:
    """What training on objective ``name`` adds to the model as configured: parameters, FLOPs per step
    (this workload's phase), and the config fields it changes."""
    changes = {k: v for k, v in trained.config.to_dict().items() if base.config.to_dict().get(k) != v}
    said = ", ".join(f"{k} {base.config.to_dict().get(k)} -> {v}" for k, v in changes.items()) or "nothing changed"
    return {"name": name, "summary": OBJECTIVES[name].summary, "config_changes": changes, "changes": said,
            "params": trained.params["total"] - base.params["total"],
            "flops": trained.flops["total"] - base.flops["total"],
            "matmul_flops": trained.flops["matmul"] - base.flops["matmul"]}


_COURSE_NOTE = ("course assignment: 20·T·d² + 4·T²·d per layer — the four attention projections counted in MACs "
                "(4·T·d²), the FFN in FLOPs (16·T·d²), QK^T+AV in FLOPs, no LM head; mixes units")


def _print_attention(con, att: dict) -> None:
    options = ", ".join(f"{k.removeprefix('attn_')} {v}" for k, v in att["options"].items())
    con.print(f"attention: [bold]{att['kind']}[/] ({att['family']}; {att['computed']})" + (f"; {options}" if options else ""))
    con.print(f"  self-attention core, forward: {fmt.flops(att['matmul_flops'])} matmul + {fmt.flops(att['other_flops'])} "
              f"element-wise, {fmt.nbytes_gb(att['bytes'])} moved, largest layer writes {fmt.nbytes_gb(att['written_per_layer'])}")


def _print_recurrent(con, rec: dict) -> None:
    con.print(f"recurrent: [bold]{rec['cell']}[/], hidden {rec['d_hidden']}; parameters {rec['params_exact']:,} exact "
              f"(two bias vectors), {rec['params_course']:,} in the course convention (one per gate)")
    con.print(f"  {fmt.flops(rec['step_matmul_flops'])} matmul per token per sequence over all layers; state "
              f"{fmt.nbytes_gb(rec['state_bytes'])} (fixed, whatever the length); "
              f"{rec['sequential_steps_per_layer']:,} sequential steps per layer (an attention layer: "
              f"{rec['sequential_steps_attention_layer']})")
    if "attention" in rec:  # arch='rnn-seq2seq'
        con.print(f"  attention: [bold]{rec['attention']}[/], {rec['attention_params']:,} parameters; "
                  f"{fmt.flops(rec['attention_step_flops'])} matmul per decoder step (grows with the source), "
                  f"{fmt.flops(rec['attention_keys_flops'])} once per source for its keys; the encoder takes "
                  f"{rec['encoder_sequential_steps_per_layer']:,} sequential steps per layer")


def task_head_line(lg) -> str:
    """What the task head is: the task, what it reads and its Linear (in place of the LM head)."""
    c, head = lg.config, lg.architecture.classifier
    reads = {"token-classification": "every token", "question-answering": "every token (a start and an end score)",
             "sequence-classification": f"one vector per sequence, {c.pooling} pooling"
                                         + (" through the pooler" if c.pooling == "cls" and c.pooler else "")}
    kind = " (regression)" if c.task == "sequence-classification" and c.n_classes == 1 else ""
    params = sum(math.prod(shape) for shape in head.parameters().values())
    return (f"  task head: {c.task}{kind} on {reads[c.task]}: Linear {head.d_in} -> {head.d_out}"
            f"{'' if head.bias else ' (no bias)'}, {params:,} parameters, in place of the LM head")


def _print_tables(lg, roof, alternatives, course, show_ops, unchunked=None) -> None:
    from rich.table import Table  # deferred: --json output never loads rich

    con = console()
    c, w = lg.config, lg.workload
    shape = f"{w.batch} x {w.seq}" + (f" -> {w.seq_decoder or w.seq}" if c.traits.seq2seq and w.phase != "decode" else "")
    ctx = f", context {w.decode_context}" if w.phase == "decode" else ""
    if c.traits.vision_only:
        shape = f"{w.batch} image{'s' if w.batch > 1 else ''}"
    con.print(f"[bold]{getattr(c, 'name', 'custom')}[/] ({c.arch}) · {w.phase} · "
              f"{'batch' if c.traits.vision_only else 'batch x seq'} {shape}{ctx} · {w.dtype}"
              + (f" · {w.optimizer}" if w.training else ""))
    if c.traits.images:
        print_image_header(con, lg)
    if getattr(c, "task", ""):
        con.print(task_head_line(lg))

    p = lg.params
    t = Table(title="Parameters (every tensor once; tied embeddings once)")
    t.add_column("part")
    t.add_column("count", justify="right")
    t.add_row("total", fmt.params(p["total"], word=True))
    t.add_row("embedding (token, type, position tables)", fmt.params(p["embedding"], word=True))
    t.add_row("non-embedding", fmt.params(p["non_embedding"], word=True))
    for comp, n in p["by_component"].items():
        t.add_row(f"  {comp}", fmt.params(n, word=True))
    con.print(t)

    f = lg.flops
    t = Table(title="FLOPs (2 per multiply-accumulate)")
    t.add_column("what")
    t.add_column("FLOPs", justify="right")
    t.add_row("matmul (= FlopCounterMode)" if w.attention_flops == "full" else "matmul (causal accounting)", fmt.flops(f["matmul"]))
    t.add_row("element-wise (conventions)", fmt.flops(f["other"]))
    t.add_row("total", fmt.flops(f["total"]))
    for phase, v in f["by_phase"].items():
        t.add_row(f"  {phase} (matmul / total)", f"{v['matmul']:,} / {v['total']:,} FLOPs")
    r = lg.rules_of_thumb
    t.add_row(f"rule of thumb {r['rule']} (N={r['N']:,}, D={r['D']:,})", fmt.flops(r["value"]))
    t.add_row("exact matmul / rule", f"{r['ratio_exact_over_rule']:.4f}" if r["ratio_exact_over_rule"] else "-")
    if course is not None:
        t.add_row("course assignment convention (mixes MACs and FLOPs)", f"{course:,} 'FLOPs' ({fmt.si(course, '', 4).rstrip()})")
        t.add_row("  correct forward matmul count", fmt.flops(lg.flops["by_phase"]["forward"]["matmul"]))
    con.print(t)
    con.print(f"[dim]{r['explanation']}[/]")
    if lg.recurrent is not None:
        _print_recurrent(con, lg.recurrent)
    else:
        _print_attention(con, lg.attention)

    m = lg.memory
    t = Table(title=f"Memory ({m['recipe']})")
    t.add_column("what")
    t.add_column("bytes", justify="right")
    for key in ("weights", "gradients", "optimizer", "activations", "kv_cache", "logits", "total"):
        label = f"logits ({w.loss_chunk:,} rows at a time)" if key == "logits" and w.training and w.loss_chunk else key
        t.add_row(label.replace("_", " "), fmt.nbytes_gb(m[key]))
    if w.training:
        vocab = vocabulary_memory(lg)
        t.add_row("  logits + what the loss keeps (share of total)",
                  f"{fmt.nbytes_gb(vocab['logits_and_loss'])} ({vocab['logits_share']:.1%})")
    if unchunked is not None:
        t.add_row("  the same without --loss-chunk (its total)",
                  f"{fmt.nbytes_gb(unchunked['logits_and_loss'])} ({unchunked['logits_share']:.1%}; total "
                  f"{fmt.nbytes_gb(unchunked['total'])})")
    if w.training:
        t.add_row("bytes per parameter", ", ".join(f"{k} {v} B" for k, v in m["bytes_per_param"].items()))
        for key, v in alternatives.items():
            t.add_row(f"  activations, {key.replace('_', ' ')}", fmt.nbytes_gb(v))
        if m["activations_per_layer"]:
            first = m["activations_per_layer"][0]
            t.add_row(f"  activations per layer ({first['stack']} layer {first['layer']})", fmt.nbytes_gb(first["bytes"]))
    if m["kv_cache_per_token"]:
        t.add_row("KV cache per token per sequence", fmt.nbytes_gb(m["kv_cache_per_token"]))
    con.print(t)
    con.print(f"[dim]total = {m['total_rule']}; activations: {m['activation_rule']}[/]")

    if roof is not None:
        t = Table(title=f"Roofline on {roof.device} ({roof.dtype}, efficiency {roof.efficiency:g})")
        t.add_column("what")
        t.add_column("value", justify="right")
        t.add_row("peak", fmt.rate(roof.peak_flops, "FLOP/s"))
        t.add_row("bandwidth", fmt.rate(roof.bandwidth, "B/s"))
        t.add_row("ridge point", f"{roof.ridge_point:.4g} FLOP/B" if isinstance(roof.ridge_point, float) else str(roof.ridge_point))
        t.add_row("predicted time", fmt.duration(roof.time_s))
        for phase, v in roof.time_by_phase.items():
            t.add_row(f"  {phase}", fmt.duration(v))
        for bound, v in roof.bound_share.items():
            t.add_row(f"  time in {bound}-bound ops", fmt.duration(v))
        t.add_row("source", roof.source)
        con.print(t)

    if show_ops:
        t = Table(title="Ops")
        t.add_column("name", overflow="fold", min_width=36)  # full module paths, so rows match a profile
        for col in ("kind", "phase", "shapes", "matmul FLOPs", "other FLOPs", "bytes (B)", "FLOP/B"):
            t.add_column(col, justify="right" if "FLOP" in col or "bytes" in col else "left")
        if roof is not None:
            t.add_column("time")
            t.add_column("bound")
        for i, op in enumerate(lg.ops):
            row = [op.name, op.kind, op.phase, op.shapes, f"{op.matmul_flops:,}", f"{op.other_flops:,}", f"{op.bytes:,}",
                   f"{op.intensity:.3g}" if op.intensity is not None else "-"]
            if roof is not None:
                row += [fmt.duration(roof.ops[i].time_s), roof.ops[i].bound]
            t.add_row(*row)
        con.print(t)

    t = Table(title="Conventions")
    t.add_column("topic")
    t.add_column("convention")
    for k, v in lg.conventions().items():
        t.add_row(k, v)
    if course is not None:
        t.add_row("course_assignment", _COURSE_NOTE)
    con.print(t)
