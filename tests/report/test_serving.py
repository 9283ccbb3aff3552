"""Section 11, "Serving": the ledger's decode speed-up by batch size always (for a decoder), the measured
table and plot from a filed serve_load record, one line naming the command without one, one line (no
traceback) for a malformed record, and a sentence instead of the ledger table for an encoder."""

from types import SimpleNamespace

from report_kit import file_record, tables, texts

from tformer.core.config import ModelConfig
from tformer.cost.batching import decode_speedups
from tformer.machine import resolve_hardware
from tformer.report import section_serving as S
from tformer.report.doc import Figure

CPU = SimpleNamespace(model="Fake Serve CPU", physical_cores=2, logical_cpus=2)
DECODER = ModelConfig(arch="decoder", vocab_size=300, d_model=64, n_heads=4, n_layers=2, d_ff=160, max_positions=96)


def context(config=DECODER):
    return SimpleNamespace(specs=SimpleNamespace(cpu=CPU), data={}, config=config, target=resolve_hardware("a100-80gb-sxm"),
                           options=SimpleNamespace(seq=None))


def level(tokens_per_s, failed=0):
    return {"tokens_per_s": tokens_per_s, "failed": failed, "ttft_s": {"p50": 0.01, "p95": 0.02, "p99": 0.03}}


def record():
    return {"date": "2026-11-25", "model": {"n_layers": 4, "d_model": 256}, "max_tokens": 32, "levels": [1, 32],
            "results": {"continuous": {"1": level(100.0), "32": level(900.0)},
                        "one-at-a-time": {"1": level(100.0), "32": level(150.0, failed=1)}},
            "predicted_speedup": {"1": {"profile": 1.0}, "32": {"profile": 12.5}}}


def filed(tmp_path, monkeypatch, doc):
    file_record(tmp_path, monkeypatch, S, CPU, doc)


def test_ledger_table_and_measured_table(tmp_path, monkeypatch):
    filed(tmp_path, monkeypatch, {"serve_load": record()})
    ctx = context()
    sec = S.build(ctx)
    assert sec.heading == "11. Serving: what batching buys"
    ledger, measured = tables(sec)
    expected = decode_speedups(DECODER, ctx.target, S.BATCHES, 95)
    assert [row[0] for row in ledger.rows] == [str(b) for b in S.BATCHES]
    assert ledger.rows[0][3] == "1.00x" and ctx.data["serving"]["predicted"]["rows"] == expected
    assert measured.rows[1][:5] == ["32", "900", "150", "6.00x", "12.50x"] and measured.rows[1][-1] == "1"
    assert "memory-bound up to a batch of about" in texts(sec)
    (fig,) = [b for b in sec.blocks if isinstance(b, Figure)]
    assert fig.png[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_a_record_one_line_names_the_bench(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "RESULTS_DIR", tmp_path)
    sec = S.build(context())
    assert len(tables(sec)) == 1
    assert "python bench/serve_load.py" in texts(sec)


def test_a_malformed_record_is_one_line(tmp_path, monkeypatch):
    bad = record()
    del bad["results"]["one-at-a-time"]["32"]
    filed(tmp_path, monkeypatch, {"serve_load": bad})
    ctx = context()
    sec = S.build(ctx)
    assert "malformed (KeyError" in texts(sec) and "rerun `python bench/serve_load.py`" in texts(sec)
    assert "missing" in ctx.data["serving"]["measured"]


def test_an_encoder_gets_a_sentence_not_a_decode_table(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "RESULTS_DIR", tmp_path)
    encoder = ModelConfig(arch="encoder", vocab_size=300, d_model=64, n_heads=4, n_layers=2, d_ff=160)
    sec = S.build(context(encoder))
    assert tables(sec) == [] and "/v1/embeddings" in texts(sec)
