"""Section 14, "A real model": SmolLM2-135M-Instruct (or Gemma 3 270M) from its GGUF file in the report: the ledger
of each weight format (the file's blocks read fewer bytes per token than fp32, by the formats' own sizes), what the
vocabulary costs, the measured decode beside the prediction, a chat reply (Gemma: a continuation), the attention maps
of both ends of the stack and a perplexity, rendered into Markdown, HTML and JSON; skipped with one line under
--no-real-model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tformer.report import section_real_model as R
from tformer.report.build import write_report
from tformer.report.doc import Document, Figure, Table

PNG = b"\x89PNG\r\n\x1a\n"


def _context(real_model=R.DEFAULT, results_dir=None):
    from test_report import fake_bench

    from tformer.machine import cpu_info

    opts = SimpleNamespace(real_model=real_model, quick=True)
    return SimpleNamespace(options=opts, results={}, data={}, say=lambda _m: None,
                           measured=fake_bench().to_device("cpu"), specs=SimpleNamespace(cpu=cpu_info()))


@pytest.fixture(scope="module")
def built(smollm2_path):
    ctx = _context()
    with pytest.MonkeyPatch.context() as mp:  # the section's path, not its figures: a short reply, one chunk
        mp.setattr(R, "REPLY_TOKENS", 10)
        mp.setattr(R, "PPL_CHUNKS", 1)
        ctx.results["real_model"] = R.measure(ctx)
    return ctx, R.build(ctx)


def test_the_section_holds_the_ledger_the_chat_the_maps_and_the_perplexity(built):
    ctx, sec = built
    assert sec.heading == "14. A real model: SmolLM2-135M-Instruct from its GGUF file" and sec.anchor == "real-model"
    data = ctx.data["real_model"]
    rows = {r["format"]: r for r in data["formats"]}
    fp32, file = rows["fp32 (dequantized)"], rows["the file: Q4_1 layers, Q8_0 head"]
    # the layers at 20 bytes per 32 weights and the head at 34, against 4 bytes a weight
    assert 5.0 < fp32["bytes_read"] / file["bytes_read"] < 6.4
    assert file["flops"] == fp32["flops"]  # a format changes the bytes, not the arithmetic
    # every row quantizes the head too (a tied head read in fp32 would add 113 MB a token): Q8_0 reads 34/32 bytes a
    # weight of what int8 per row reads at 1 (+ its per-row scales), each row below fp32's quarter plus the KV
    q8, int8 = rows["Q8_0 everywhere"], rows["int8 per row"]
    assert 1.0 < q8["bytes_read"] / int8["bytes_read"] < 34 / 32 + 0.01
    assert all(r["bytes_read"] < fp32["bytes_read"] * 0.3 for r in data["formats"] if r is not fp32)
    assert data["chat"]["reply"].strip() and "Paris" in data["chat"]["reply"]
    assert data["decode_tokens_per_s"] > 0 and 1 < data["perplexity"] < 100
    figures = [b for b in sec.blocks if isinstance(b, Figure)]
    assert [f.name for f in figures] == ["real_model_attention"] and figures[0].png.startswith(PNG)
    layers = {m.layer for m in ctx.results["real_model"]["maps"]}
    assert layers == {0, 29} and len(ctx.results["real_model"]["maps"]) == 2 * 9
    table = next(b for b in sec.blocks if isinstance(b, Table))
    labels = [label for label, _ in R.FORMATS]
    assert [r[0] for r in table.rows] == [*labels[:3], "the file: Q4_1 layers, Q8_0 head", *labels[3:]]


def test_the_eager_step_is_explained_in_named_terms(built):
    """The measured eager step beside the ledger's, split into weight products, other ops and a fixed cost per
    ledger op (the framework glue timed on the model's skeleton): fp32, and the file's blocks on the kernel."""
    from tformer.model import ggml_kernel

    ctx, sec = built
    steps = ctx.data["real_model"]["steps"]
    rows = {r["weights"].split(" (")[0]: r for r in steps["rows"]}
    fp32 = rows["fp32"]
    assert fp32["measured_step_s"] == pytest.approx(1 / ctx.data["real_model"]["decode_tokens_per_s"])
    for r in steps["rows"]:
        terms = (r["predicted_products_s"] + r["predicted_attention_s"] + r["predicted_others_s"]
                 + r["predicted_fixed_s"])
        assert r["predicted_step_s"] == pytest.approx(terms) and r["predicted_fixed_s"] > 0
        assert r["predicted_fixed_s"] == pytest.approx(r["ops"] * r["per_op_s"])
    if ggml_kernel.available():
        kernel = rows["Q4_1 layers, Q8_0 head"]
        # the file's blocks read about a fifth of fp32's bytes; the ops and their glue are the same
        assert 4.5 < fp32["bytes_read"] / kernel["bytes_read"] < 6.4 and kernel["ops"] == fp32["ops"]
        assert kernel["predicted_products_s"] < fp32["predicted_products_s"]
    table = [b for b in sec.blocks if isinstance(b, Table) and "fixed cost" in b.headers]
    assert len(table) == 1 and len(table[0].rows) == len(steps["rows"])


def test_it_renders_into_every_format(built, tmp_path):
    ctx, sec = built
    out = tmp_path / "report"
    write_report(out, Document("t", ["line"], [sec]), {"real_model": ctx.data["real_model"]})
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "## 14. A real model" in md and "](plots/real_model_attention.png)" in md
    assert "SmolLM2" in page and 'src="data:image/png;base64,' in page
    assert json.loads((out / "report.json").read_text())["real_model"]["chat"]["user"] == R.MODELS[R.DEFAULT].prompt


def test_skipped_in_one_line():
    ctx = _context(real_model="")
    ctx.results["real_model"] = R.measure(ctx)
    sec = R.build(ctx)
    assert [b.text for b in sec.blocks] == ["No real model: skipped (--no-real-model)."]


def test_the_cli_offers_the_sections_models():
    from tformer.cli.report import REAL_MODELS

    assert REAL_MODELS == tuple(R.MODELS) and REAL_MODELS[0] == R.DEFAULT


def test_gemma3_shows_its_vocabulary_its_block_mix_and_a_continuation(gemma3_path):
    """`--real-model gemma3-270m`: the base model continues a prompt (no chat template), its 262k vocabulary's
    shares lead, its Q4_K_M mix is priced from the config the file gave, and the perplexity starts chunks with BOS."""
    ctx = _context("gemma3-270m")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "REPLY_TOKENS", 6)
        mp.setattr(R, "PPL_CHUNKS", 1)
        ctx.results["real_model"] = R.measure(ctx)
    sec = R.build(ctx)
    data = ctx.data["real_model"]
    assert sec.heading == "14. A real model: Gemma 3 270M from its GGUF file" and data["model"] == "gemma3-270m"
    assert "Paris" in data["continuation"]["reply"] and "chat" not in data
    assert 0.6 < data["vocabulary"]["embedding_params_share"] < 0.65  # 167,772,160 of 268,098,176
    rows = {r["format"]: r for r in data["formats"]}
    fp32, file = rows["fp32 (dequantized)"], rows["the file: Q4_K_M mix, Q8_0 head"]
    assert file["flops"] == fp32["flops"] and 3.5 < fp32["bytes_read"] / file["bytes_read"] < 4.5
    assert {m.layer for m in ctx.results["real_model"]["maps"]} == {0, 17}
    assert 1 < data["perplexity"] < 100
    text = " ".join(b.text for b in sec.blocks if hasattr(b, "text"))
    assert "262,144-token vocabulary" in text and "512-token window" in text
