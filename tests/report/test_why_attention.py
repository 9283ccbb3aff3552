"""Section 10, "Why attention": the ledger's part always (both models, FLOPs per token and sequential
steps), the measured table and plots from a filed rnn_vs_transformer record, one line naming the command
without one, and one line (no traceback) for a malformed record."""

from types import SimpleNamespace

import pytest
from report_kit import file_record

from tformer.core.errors import TformerError
from tformer.cost.rnn_vs_attention import NS, model_pair, param_count
from tformer.report import plots
from tformer.report import section_why_attention as W
from tformer.report.doc import Figure, Table, Text

CPU = SimpleNamespace(model="Fake Why CPU", physical_cores=2, logical_cpus=2)
MODELS = ("lstm", "transformer")


def context():
    return SimpleNamespace(specs=SimpleNamespace(cpu=CPU), data={}, options=SimpleNamespace(quick=True))


def record():
    tput = {"ns": [64, 128], "tokens_per_step": 256}
    for i, m in enumerate(MODELS):
        tput[m] = [{"n": n, "tokens_per_s": 1000.0 / (j + 1 + i), "growth": 1.0 + j, "predicted_growth": 1.0 + i * j,
                    "sequential_steps": 2 * n if m == "lstm" else 4} for j, n in enumerate((64, 128))]
    return {"date": "2026-02-03", "settings": {"lm_steps": 5, "recall_steps": 6},
            "models": {m: {"params": 1000 + i} for i, m in enumerate(MODELS)},
            "val_loss": {"lstm": 2.5, "transformer": 2.0},
            "throughput": tput,
            "recall": {"shown": [8, 512], "chance": 0.125, "lstm": [[8, 0.5], [512, 0.125]],
                       "transformer": [[8, 1.0], [512, 1.0]]},
            "gradient_reach": {"distances": [0, 1, 8, 512],
                               "lstm": {"init": [1, 0.5, 1e-3, 0.0], "trained": [1, 0.6, 1e-2, 1e-9]},
                               "transformer": {"init": [1, 0.1, 0.1, 0.1], "trained": [1, 0.2, 0.2, 0.3]}}}


def filed(tmp_path, monkeypatch, doc):
    file_record(tmp_path, monkeypatch, W, CPU, doc)


@pytest.fixture
def drawn(monkeypatch):
    """The series each plot was drawn from, by figure title."""
    seen = {}

    def spy(name):
        original = getattr(plots, name)

        def wrapper(series, *args, **kwargs):
            seen[args[-1]] = series  # the title
            return original(series, *args, **kwargs)
        monkeypatch.setattr(plots, name, wrapper)

    spy("loglog_by_kind")
    spy("curves_by_model")
    return seen


def test_section_with_a_record(tmp_path, monkeypatch, drawn):
    filed(tmp_path, monkeypatch, {"rnn_vs_transformer": record()})
    ctx = context()
    sec = W.build(ctx)
    assert sec.heading == "10. Why attention"
    figures = [b for b in sec.blocks if isinstance(b, Figure)]
    assert [f.name for f in figures] == ["why_attention_ledger", "why_attention_throughput", "why_attention_recall",
                                         "why_attention_gradient"]
    assert all(f.png[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert set(drawn["Predicted cost per token vs n"]) == set(MODELS)
    assert set(drawn["Training throughput vs sequence length"]) == set(MODELS)
    assert set(drawn["Long-range recall"]) == set(MODELS)
    curves = {f"{m} {w}" for m in MODELS for w in ("init", "trained")}
    assert set(drawn["Gradient reaching earlier positions"]) == curves
    # distance 0 and zero norms have no place on the log axes
    assert drawn["Gradient reaching earlier positions"]["lstm init"] == [(1, 0.5), (8, 1e-3)]
    tables = [b for b in sec.blocks if isinstance(b, Table)]
    ledger_table, measured = tables
    assert [r[0] for r in ledger_table.rows] == [str(n) for n in NS]
    assert ledger_table.rows[-1][3] == str(2 * NS[-1]) and ledger_table.rows[-1][4] == "4"
    assert measured.headers == ["", *MODELS] and "2026-02-03" in measured.caption
    assert ["recall accuracy, k = 512", "12%", "100%"] in measured.rows
    assert ctx.data["why_attention"]["measured"]["record"]["val_loss"]["lstm"] == 2.5


def test_section_without_a_record_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(W, "RESULTS_DIR", tmp_path)
    ctx = context()
    sec = W.build(ctx)
    assert [f.name for f in sec.figures()] == ["why_attention_ledger"]  # the ledger's part is always there
    assert "python bench/rnn_vs_transformer.py" in sec.blocks[-1].text
    assert "missing" in ctx.data["why_attention"]["measured"]
    # a results file from other benches, without this one's section: the same line
    filed(tmp_path, monkeypatch, {"attention_quality": {"kinds": [1]}})
    assert "holds no rnn_vs_transformer record yet" in W.build(context()).blocks[-1].text


@pytest.mark.parametrize("doc", ["{not json", {"rnn_vs_transformer": {**record(), "throughput": {"ns": [64]}}},
                                 {"rnn_vs_transformer": {**record(), "recall": "?"}}])
def test_malformed_record_is_one_line(tmp_path, monkeypatch, doc):
    filed(tmp_path, monkeypatch, doc)
    sec = W.build(context())
    last = sec.blocks[-1]
    assert isinstance(last, Text) and last.text.startswith("Measured: ") and "\n" not in last.text
    assert "Traceback" not in last.text
    assert [f.name for f in sec.figures()] == ["why_attention_ledger"]


@pytest.mark.parametrize(("vocab", "expected"), [(28, 28), ("many", W.CHAR_VOCAB), (None, W.CHAR_VOCAB)])
def test_the_ledger_part_costs_the_records_vocabulary(tmp_path, monkeypatch, vocab, expected):
    doc = record()
    if vocab is not None:
        doc["models"]["transformer"]["config"] = {"vocab_size": vocab}
    filed(tmp_path, monkeypatch, {"rnn_vs_transformer": doc})
    ctx = context()
    W.build(ctx)
    pair = model_pair(expected)
    assert {m: p["params"] for m, p in ctx.data["why_attention"]["predicted"].items()} == \
        {m: param_count(c) for m, c in pair.items()}


def test_a_vocabulary_no_lstm_can_match_falls_back_to_the_benchs(tmp_path, monkeypatch):
    doc = record()
    doc["models"]["transformer"]["config"] = {"vocab_size": 28}
    filed(tmp_path, monkeypatch, {"rnn_vs_transformer": doc})

    def refuse(vocab):
        if vocab == 28:
            raise TformerError("no 2-layer lstm comes within 2%")
        return model_pair(vocab)
    monkeypatch.setattr(W, "model_pair", refuse)
    ctx = context()
    W.build(ctx)
    assert ctx.data["why_attention"]["predicted"]["transformer"]["params"] == \
        param_count(model_pair(W.CHAR_VOCAB)["transformer"])
