"""Section 10: why attention — an LSTM and a Transformer of equal size set side by side. The ledger's part is
always shown (no torch, no measurement): FLOPs per training token and sequential steps against n for the
pair bench/rnn_vs_transformer.py trains (tformer.cost.rnn_vs_attention). The measured part is read from the
latest rnn_vs_transformer record filed for this CPU: training tokens/s against n, recall accuracy against
the distance k, and the gradient reaching each earlier position; without a record, one line names the
command that makes it. Nothing is measured while the report runs.
"""

from __future__ import annotations

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.cost.rnn_vs_attention import NS, model_pair, param_count, predicted_growth
from tformer.measure.rnn_vs_attention import MODELS, comparison_rows
from tformer.report import plots
from tformer.report.doc import Section
from tformer.report.section_long_context import MALFORMED, RESULTS_DIR, bench_record, parsed_record

COMMAND = "python bench/rnn_vs_transformer.py"
CHAR_VOCAB = 84  # the char-level Shakespeare tokenizer's vocabulary (specials included): what the bench trains on


def predicted(vocab_size: int = CHAR_VOCAB) -> dict:
    """The ledger's view of the bench's pair: parameters and, per n, FLOPs per token and sequential steps."""
    pair = model_pair(vocab_size)
    return {name: {"params": param_count(config), "d_hidden": config.d_hidden, "n_layers": config.n_layers,
                   "rows": predicted_growth(config, NS)} for name, config in pair.items()}


def build(ctx) -> Section:
    sec = Section(10, "Why attention", "why-attention")
    record, source = bench_record(ctx.specs.cpu, "rnn_vs_transformer", "rnn_vs_transformer record", COMMAND,
                                  "models", RESULTS_DIR)
    try:
        ledger_view = predicted(_vocab(record))
    except TformerError:  # a record's vocabulary no equal-size LSTM can match: cost the bench's own
        ledger_view = predicted(CHAR_VOCAB)
    data: dict = {"predicted": ledger_view}
    lstm, attention = ledger_view["lstm"], ledger_view["transformer"]
    sec.text(f"An LSTM language model ({lstm['n_layers']} layers, d_hidden {lstm['d_hidden']}, "
             f"{fmt.count(lstm['params'])} parameters) against a decoder of equal size ({attention['n_layers']} "
             f"layers, {fmt.count(attention['params'])} parameters; the LSTM's width solved with the ledger). "
             "Per token of a training step the LSTM's cost is flat in n but its layers take n steps one after "
             "another; attention's cost grows with n (the n x n score matrix) in one step per layer.")
    sec.table(["n", "LSTM FLOPs/token", "Transformer FLOPs/token", "LSTM sequential steps",
               "Transformer sequential steps"],
              [[r["n"], f"{fmt.si(r['flops_per_token'], 'FLOP')} ({r['growth']:.2f}x)",
                f"{fmt.si(a['flops_per_token'], 'FLOP')} ({a['growth']:.2f}x)", r["sequential_steps"],
                a["sequential_steps"]] for r, a in zip(lstm["rows"], attention["rows"])],
              caption="Predicted by the ledger: FLOPs per token of a training step (growth over n = 64) and the "
                      "steps a forward pass takes in sequence")
    sec.figure("why_attention_ledger",
               plots.loglog_by_kind({m: {"predicted": [(r["n"], r["flops_per_token"]) for r in ledger_view[m]["rows"]]}
                                     for m in MODELS}, "FLOPs per training token", "Predicted cost per token vs n"),
               "FLOPs per token of a training step against n, as the ledger predicts them for both models.")
    _measured(sec, record, source, data)
    ctx.data["why_attention"] = data
    return sec


def _vocab(record: dict | None) -> int:
    """The vocabulary the record's models were built with (CHAR_VOCAB without a record or with a bad one)."""
    try:
        vocab = record["models"]["transformer"]["config"]["vocab_size"]
    except MALFORMED:
        return CHAR_VOCAB
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and 0 < vocab <= 1_000_000 else CHAR_VOCAB


def _measured(sec: Section, record: dict | None, source: str, data: dict) -> None:
    parsed = parsed_record(sec, data, record, source, "rnn_vs_transformer", COMMAND,
                           lambda r: (*comparison_rows(r), _figures(r)))
    if parsed is None:
        return
    headers, rows, figures = parsed
    settings = record.get("settings", {})
    sec.table(headers, rows, caption=f"Measured on this CPU ({source}): the same seed, data, optimiser and steps "
                                     f"({settings.get('lm_steps')} language-model, {settings.get('recall_steps')} "
                                     "recall); time/token growth beside the ledger's FLOPs/token growth")
    for name, png, caption in figures:
        sec.figure(name, png, caption)
    data["measured"] = {"source": source, "record": record}


def _figures(record: dict) -> list[tuple[str, bytes, str]]:
    """The three measured plots; a record missing a part raises (KeyError, TypeError, ...)."""
    tput, recall, reach = record["throughput"], record["recall"], record["gradient_reach"]
    speed = {m: {"measured": [(r["n"], r["tokens_per_s"]) for r in tput[m]]} for m in MODELS}
    accuracy = {m: [(k, a) for k, a in recall[m]] for m in MODELS}
    # distance 0 (the position predicting) has no place on a log axis: the curves start one token back
    grads = {f"{m} {when}": [(d, g) for d, g in zip(reach["distances"], reach[m][when]) if d > 0 and g > 0]
             for m in MODELS for when in ("init", "trained")}
    return [
        ("why_attention_throughput",
         plots.loglog_by_kind(speed, "training tokens/s", "Training throughput vs sequence length"),
         f"Training tokens/s against n ({tput.get('tokens_per_step')} tokens per step at every n), both models."),
        ("why_attention_recall",
         plots.curves_by_model(accuracy, "distance k (tokens between the key and its query)", "accuracy",
                               "Long-range recall", floor=(float(recall["chance"]), "chance")),
         "Accuracy of recalling the value paired with a key shown k tokens earlier, after the same training."),
        ("why_attention_gradient",
         plots.curves_by_model(grads, "distance back from the last position", "gradient norm at the embedding",
                               "Gradient reaching earlier positions", log_y=True),
         ("Norm of the last prediction's loss gradient at the token embedding d positions back, at "
          "initialisation (dashed) and after recall training (solid).")),
    ]
