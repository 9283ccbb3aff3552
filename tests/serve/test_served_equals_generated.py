"""Served equals generated (issues 45 and 48): greedy tokens from the serving loop and from `tformer serve`'s
endpoints are the tokens tformer.generate gives the same prompt alone, token for token, in fp32, in kept blocks of
every format the GGUF reader keeps (widened exactly) and on the block kernel (8-bit activations, with row-exact
attention: tformer.model.attention.row_exact), at 1, 2, 7 and 32 concurrent requests, for prompts shorter and
longer than the prefill chunk and prompts that share a start (the prefix cache), eager and compiled, on tiny
models and on the real SmolLM2 and Gemma 3; and a model kept in blocks answers what its dequantized fp32 twin
answers.

What broke it: a kept Linear's path (the blocks widened exactly, or torch's int4 kernel on bf16 activations with
bf16 logits) was chosen per bucket of rows by timing, so a prompt decoded alone (one row) and in a served batch
(eight, thirty-two) took different arithmetic, and the kernel's bf16 logits broke near-ties their own way (the
real SmolLM2 served "L'Étoile, ..." for the capital of France). Now a path never changes by timing: kept blocks
compute the dequantized model's numbers, and the bf16 kernel runs only when asked for (--bf16-kernel).

On that kernel no token-for-token promise is made, and none is tested: its rows do not depend on the batch
(tested below, bit for bit), but what reaches it does by an fp32 ulp (the prefix cache computes a prompt's last
token alone, a chunk's attention and the pool's column buckets change the order of fp32 sums), and its bf16
rounding of the input turns an ulp, now and then, into a 2^-9 step and a different near-tie pick: on the real
SmolLM2, "What is the capital of France?" answered alone and again beside three others after the prefix cache
held it came out "L'Étoile, ..." and "The capital of France is Paris." In fp32 the same ulps move logits by
1e-7 and no pick in these tests.

The tiny model speaks SmolLM2's tokenizer and chat template (the packaged file), so chat runs as it does for real;
its Linears are 64 and 256 wide, whole blocks of every format the GGUF reader keeps (Q4_K and Q6_K need 256)."""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from fastapi.testclient import TestClient

from tformer.adapt.quantize import quantize_model
from tformer.core.config import ModelConfig
from tformer.generate import generate
from tformer.generate.chat import Chat, chat_ids, template_for
from tformer.generate.continuous import PREFILL_CHUNK, ContinuousBatcher, Request
from tformer.generate.search import GenerationConfig, prompt_ids
from tformer.measure.perplexity import perplexity
from tformer.model import build, ggml_kernel
from tformer.model.path_choice import choose_paths
from tformer.model.quantized import QuantizedLinear, kernels, quantized_path, use_path
from tformer.serve import create_app
from tformer.serve.app import ServeSettings

QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "Write a haiku about the sea.",
             "Why is the sky blue?"]
TEXTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog, and then the dog",
         "def reverse(s):\n    return"]
NEW = 12
# A Q4_K_M-like mix: every format the GGUF reader keeps, the K-quants on the 256-wide down projection.
MIX = ["q:q8_0,k:q4_1,v:q5_0,o:q8_0,gate:q4_1,up:q5_0,down:q4_k",
       "q:q4_1,k:q5_0,v:q8_0,o:q4_1,gate:q5_0,up:q8_0,down:q6_k"]
KERNEL = pytest.mark.skipif(not kernels()[4], reason="this torch has no int4 CPU kernel")
BLOCKS = pytest.mark.skipif(not ggml_kernel.available(), reason="the block kernel is not built (no C compiler)")
# "+blocks": the same blocks on tformer's block kernel (8-bit activations, llama.cpp's arithmetic; the default for
# a GGUF file's kept matrices)
MODES = ["fp32", "q8_0", "q4_1", "q5_0", "mixed"] + [pytest.param(f"{m}+blocks", marks=BLOCKS)
                                                     for m in ("q8_0", "q4_1", "q5_0", "mixed")]


@pytest.fixture(scope="module")
def tok(smollm2):
    return smollm2[1]


@pytest.fixture(scope="module")
def fp32(tok):
    config = ModelConfig(arch="decoder", position="rope", norm="rmsnorm", activation="silu", gated_mlp=True,
                         bias=False, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=256,
                         vocab_size=tok.vocab_size, max_positions=512, tied_embeddings=False,
                         eos_token_id=tok.eos_id, bos_token_id=tok.bos_id)
    torch.manual_seed(0)
    model = build(config).eval()
    with torch.no_grad():  # away from the initialisation, so greedy picks are not one repeated token
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def _model(fp32, mode: str):
    weights, _, path = mode.partition("+")
    if weights == "fp32":
        return fp32
    model = (quantize_model(fp32, "mixed", layers=MIX, head="q8_0") if weights == "mixed"
             else quantize_model(fp32, weights))
    if path:
        use_path(model, "kernel" if path == "bf16-kernel" else path)
    return model


@pytest.fixture(scope="module")
def models():
    """Each mode's model, built once for the module's tests."""
    return {}


def _get(models, fp32, mode):
    if mode not in models:
        models[mode] = _model(fp32, mode)
    return models[mode]


def dequantized_twin(kept, fp32):
    """The float model whose Linears hold ``kept``'s blocks widened: what the blocks mean."""
    twin = copy.deepcopy(fp32)
    with torch.no_grad():
        for name, module in kept.named_modules():
            if isinstance(module, QuantizedLinear):
                twin.get_submodule(name).weight.copy_(module.dequantized())
    return twin


def _prompts(tok) -> list[list[int]]:
    """Chat prompts (they share the template's system start: the prefix cache), plain texts, and one prompt longer
    than the prefill chunk (read over several rounds)."""
    template = template_for(tok)
    prompts = [chat_ids(template, tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    prompts += [prompt_ids(tok, t) for t in TEXTS]
    long = prompt_ids(tok, " ".join(["the river runs to the sea and the sea is never full"] * 40))
    assert len(long) > PREFILL_CHUNK
    return prompts + [long[:PREFILL_CHUNK + 60]]


def _alone(model, prompt, stops) -> list[int]:
    out = generate(model, [prompt], max_new_tokens=NEW, stop_tokens=stops).sequences[0]
    return [t for t in out if t not in stops]


def _chat_reply(client, question: str, max_tokens: int) -> str:
    """One user message through /v1/chat/completions, greedy: the reply's text."""
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": question}],
                                                  "temperature": 0, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _served(model, prompts, stops, max_batch=32, compile=False) -> list[list[int]]:
    """Every prompt submitted at once, then the loop started: they share rounds of prefill and decode."""
    batcher = ContinuousBatcher(model, max_batch=max_batch, compile=compile)
    got = [[] for _ in prompts]
    for i, p in enumerate(prompts):
        batcher.submit(Request(p, NEW, stop_tokens=tuple(stops)),
                       lambda seq, token, finish, i=i: token is not None and got[i].append(token))
    batcher.start()
    assert batcher.shutdown(drain=True, timeout=300)
    return got


@pytest.mark.parametrize("mode", MODES)
def test_served_tokens_equal_generated_at_every_concurrency(tok, fp32, models, mode):
    model = _get(models, fp32, mode)
    stops = [tok.eos_id, tok.encode("<|im_end|>", special=True)[0]]
    prompts = _prompts(tok)
    alone = [_alone(model, p, stops) for p in prompts]
    assert len({tuple(a) for a in alone}) > 1  # the prompts are answered differently: a stuck model proves nothing
    for n in (1, 2, 7, 32):
        batch = [prompts[i % len(prompts)] for i in range(n)]
        assert _served(model, batch, stops) == [alone[i % len(prompts)] for i in range(n)], (mode, n)
    if mode in ("q8_0", "q4_1", "q5_0", "mixed"):  # kept blocks mean their dequantized weights, nothing else
        twin = dequantized_twin(model, fp32)
        assert [_alone(twin, p, stops) for p in prompts] == alone


def test_a_kept_model_runs_its_blocks_exactly_until_the_kernel_is_asked_for(fp32, models):
    """No pass, batcher or generate call moves a kept Linear onto the bf16 kernel by itself."""
    model = _get(models, fp32, "mixed")
    ContinuousBatcher(model, max_batch=32)
    generate(model, [[1, 2, 3]], max_new_tokens=2)
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert layers and all(m.path == "reference" and m._packed is None for m in layers)


@KERNEL
@pytest.mark.parametrize("mode", ["q8_0", "q4_1", "q5_0", "mixed"])
def test_the_bf16_kernel_computes_each_row_as_it_would_alone(fp32, models, mode):
    """What the kernel itself owes serving: a row's product, bit for bit, whatever rows share the call."""
    model = _get(models, fp32, mode)
    with torch.no_grad(), quantized_path(model, "kernel"):
        choose_paths(model)
        for name, layer in model.named_modules():
            if isinstance(layer, QuantizedLinear):
                x = torch.randn(64, layer.in_features, generator=torch.Generator().manual_seed(len(name)))
                whole = layer(x)
                for rows in (1, 2, 7, 32):
                    assert torch.equal(layer(x[:rows]), whole[:rows]), (name, rows)


@pytest.mark.parametrize("mode", ["fp32", "q4_1", pytest.param("q4_1+blocks", marks=BLOCKS)])
def test_the_http_endpoints_answer_what_chat_and_generate_answer(tok, fp32, models, mode):
    """/v1/chat/completions equals Chat.send (what `tformer chat` and `generate --chat` run), /v1/completions
    equals generate on the text's ids; each request alone, then all seven at once."""
    model = _get(models, fp32, mode)
    want_chat = [Chat(model, tok, settings=GenerationConfig(max_new_tokens=NEW)).send(q).text for q in QUESTIONS]
    want_text = [tok.decode(_alone(model, prompt_ids(tok, t), [tok.eos_id]), skip_special=True) for t in TEXTS]
    with TestClient(create_app(model, tok, name="tiny", settings=ServeSettings(max_batch=32))) as client:
        def chat(q):
            return _chat_reply(client, q, NEW)

        def complete(t):
            r = client.post("/v1/completions", json={"prompt": t, "temperature": 0, "max_tokens": NEW})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        assert [chat(q) for q in QUESTIONS] == want_chat
        assert [complete(t) for t in TEXTS] == want_text
        start = threading.Barrier(len(QUESTIONS) + len(TEXTS))

        def together(job):
            start.wait()
            return job()

        with ThreadPoolExecutor(len(QUESTIONS) + len(TEXTS)) as pool:
            futures = [pool.submit(together, lambda q=q: chat(q)) for q in QUESTIONS]
            futures += [pool.submit(together, lambda t=t: complete(t)) for t in TEXTS]
            got = [f.result() for f in futures]
    assert got == want_chat + want_text


@pytest.mark.slow
@pytest.mark.torch_behaviour  # torch.compile's graph, on both ends of the supported torch range
@pytest.mark.parametrize("mode", ["fp32", "mixed", pytest.param("mixed+blocks", marks=BLOCKS)])
def test_compiled_serving_equals_compiled_generate(tok, fp32, models, mode):
    model = _get(models, fp32, mode)
    stops = [tok.eos_id]
    prompts = _prompts(tok)[:5]
    alone = [generate(model, [p], max_new_tokens=NEW, stop_tokens=stops, compile=True).sequences[0] for p in prompts]
    alone = [[t for t in a if t not in stops] for a in alone]
    for n in (1, 7):
        batch = [prompts[i % len(prompts)] for i in range(n)]
        assert _served(model, batch, stops, compile=True) == [alone[i % len(prompts)] for i in range(n)], (mode, n)


@pytest.mark.parametrize("mode", ["q4_1", "mixed", pytest.param("q4_1+bf16-kernel", marks=KERNEL)])
def test_perplexity_of_kept_blocks_is_the_dequantized_models(tok, fp32, models, mode):
    """Kept blocks score a text exactly as their fp32 twin does (the same weights, widened); on the bf16 kernel
    within 1% (its activations rounded to bf16: about 0.4% relative each). (The block kernel's bound is held on
    the real model below: this random model's perplexity of 1.8 million moves 2% under 8-bit activations.)"""
    model = _get(models, fp32, mode)
    twin = dequantized_twin(model, fp32)
    ids = prompt_ids(tok, " ".join(TEXTS * 12))
    want = perplexity(twin, ids, ctx=64, max_chunks=3).perplexity
    got = perplexity(model, ids, ctx=64, max_chunks=3).perplexity
    if "+" in mode:
        assert got != want and abs(got / want - 1) < 0.01
    else:
        assert got == pytest.approx(want, rel=1e-6)


# The real SmolLM2-135M-Instruct (Q4_1 layers, Q8_0 head) through the server, the two chat commands and perplexity:
# fp32 and kept blocks compute one set of numbers, and the server answers what both commands answer.
@pytest.mark.slow
@pytest.mark.parametrize("weights", [
    "dequantize", "keep",
    # The block kernel (8-bit activations, the commands' default): generate, chat and the server agree token for
    # token. Its answer starts as llama-server's on the same file ("L'Étoile, la Marseillaise, la femme": the fp32
    # top two for the first token are 0.08 apart and swap under 8-bit activations) and parts from it at a near tie
    # (llama-server: "... au roi", tformer: ", la femme au martyre"): two engines' fp32 sums differ by ulps.
    # Before row-exact attention the server and generate parted the same way: the pool's column buckets and
    # chunked prefill summed attention in another order than generate's prefill, and an ulp that crossed an 8-bit
    # rounding step, over 30 layers, flipped a near tie.
    pytest.param("kernel", marks=BLOCKS),
])
def test_the_real_model_serves_what_generate_chat_and_chat_answer(weights, smollm2_path, capsys, monkeypatch):
    from tformer.interop.gguf_model import load_gguf

    model, tokenizer = load_gguf(smollm2_path, tokenizer=True, weights=weights)
    generated = _generate_then_chat(smollm2_path, weights, capsys, monkeypatch)
    assert _served_chat(model, tokenizer, QUESTIONS) == generated
    if weights != "kernel":  # the file's own numbers in fp32 (the kernel's answer is llama.cpp's: see above)
        assert "Paris" in generated[0], generated[0]


@pytest.mark.slow
@BLOCKS
def test_gemma3_on_the_block_kernel_serves_what_generate_gives(gemma3_path):
    """Gemma 3 270M (Q4_K_M: Q4_K, Q6_K, Q8_0 and Q5_0 matrices; sliding-window layers beside global ones, read as
    their band by row-exact attention) on the kernel, the commands' default: the serving loop, each text alone and
    all at once, continues them as generate does (a base model: plain text, no chat template)."""
    from tformer.interop.gguf_model import load_gguf

    model, tokenizer = load_gguf(gemma3_path, tokenizer=True, weights="kernel")
    layers = [m for m in model.modules() if hasattr(m, "row_exact")]
    assert {m.kind for m in layers} >= {"sliding"} and all(m.row_exact for m in layers)
    prompts = [prompt_ids(tokenizer, t) for t in TEXTS + QUESTIONS]
    stops = [tokenizer.eos_id]
    alone = [_alone(model, p, stops) for p in prompts]
    assert len({tuple(a) for a in alone}) > 1
    for batch in ([prompts[0]], prompts):
        assert _served(model, batch, stops) == alone[:len(batch)]


@pytest.mark.slow
@BLOCKS
def test_the_real_model_on_the_block_kernel_generates_what_chat_answers(smollm2_path, capsys, monkeypatch):
    """What holds on the block kernel today (the strict xfail above is the served part): `generate --chat` and
    `chat` run the same path and answer alike, every Linear on the kernel, its pool on torch's threads."""
    from tformer.interop.gguf_model import load_gguf
    from tformer.model.quantized import QuantizedLinear

    threads = torch.get_num_threads()
    model = load_gguf(smollm2_path, weights="kernel")
    linears = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert linears and all(m.path == "blocks" for m in linears)
    assert (ggml_kernel._THREADS, torch.get_num_threads()) == (threads, 1)
    generated = _generate_then_chat(smollm2_path, "kernel", capsys, monkeypatch)
    assert all(reply.strip() for reply in generated)


def _generate_then_chat(path, weights, capsys, monkeypatch) -> list[str]:
    """`tformer generate --chat` on each question, then `tformer chat` on all of them (reset between): equal
    replies, returned."""
    import io
    import json

    from tformer.cli import main

    flags = ["--gguf", str(path), "--gguf-weights", weights, "--greedy", "--max-new-tokens", "24"]
    generated = []
    for q in QUESTIONS:
        assert main(["generate", *flags, "--chat", q, "--json"]) == 0
        generated.append(json.loads(capsys.readouterr().out)["reply"])
    monkeypatch.setattr("sys.stdin", io.StringIO("\n/reset\n".join(QUESTIONS) + "\n"))
    assert main(["chat", *flags]) == 0
    assert capsys.readouterr().out == "".join(reply + "\n" for reply in generated)
    return generated


def _served_chat(model, tokenizer, questions, max_tokens=24) -> list[str]:
    """Each question alone, then all at once: the two answers must agree before either is returned."""
    with TestClient(create_app(model, tokenizer, name="smollm2", settings=ServeSettings(max_batch=32))) as client:
        def chat(q):
            return _chat_reply(client, q, max_tokens)

        alone = [chat(q) for q in questions]
        with ThreadPoolExecutor(len(questions)) as pool:
            assert list(pool.map(chat, questions)) == alone
    return alone


@pytest.mark.slow
def test_the_real_model_s_kept_perplexity_is_its_fp32_perplexity(smollm2, smollm2_kept):
    """WikiText-2, four 512-token chunks: kept blocks give the fp32 model's perplexity exactly; the block kernel
    (8-bit activations, as llama.cpp) within 1%; the bf16 kernel within 0.5% (measured +0.014% over six chunks on an AMD EPYC, at most 0.17% on one chunk)."""
    from tformer.data.corpora import get_corpus
    from tformer.model.quantized import quantized_path

    dense, tokenizer = smollm2
    ids = tokenizer.encode(get_corpus("wikitext2").text("test")[:40_000])
    bos = tokenizer.bos_id if tokenizer.add_bos else None
    fp32 = perplexity(dense, ids, ctx=512, bos_id=bos, max_chunks=4)
    kept = perplexity(smollm2_kept, ids, ctx=512, bos_id=bos, max_chunks=4)
    assert kept.chunk_ppl == fp32.chunk_ppl
    if ggml_kernel.available():
        with quantized_path(smollm2_kept, "blocks"):
            blocks = perplexity(smollm2_kept, ids, ctx=512, bos_id=bos, max_chunks=4)
        assert blocks.perplexity != fp32.perplexity and abs(blocks.perplexity / fp32.perplexity - 1) < 0.01
    if kernels()[4]:
        with quantized_path(smollm2_kept, "kernel"):
            bf16 = perplexity(smollm2_kept, ids, ctx=512, bos_id=bos, max_chunks=4)
        assert bf16.perplexity != fp32.perplexity and abs(bf16.perplexity / fp32.perplexity - 1) < 0.005
