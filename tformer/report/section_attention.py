"""Section 8: attention made visible — heat maps of the heads on a real sentence, and what each head
mostly does (attend to itself, to the previous token, to the first token), measured off the maps."""

from __future__ import annotations

import math

from tformer.core import fmt
from tformer.report import plots
from tformer.report.doc import Section


def head_stats(m) -> dict:
    """Average over queries of the weight on self, on the previous token and on the first token, and
    the mean entropy in bits (0 = all weight on one key)."""
    w = m.weights
    T = w.shape[0]
    self_w = float(sum(w[i, i] for i in range(T)) / T)
    prev = float(sum(w[i, i - 1] for i in range(1, T)) / (T - 1)) if T > 1 else 0.0
    first = float(sum(w[i, 0] for i in range(1, T)) / (T - 1)) if T > 1 else 1.0
    ent = 0.0
    for i in range(T):
        row = w[i]
        ent += -sum(float(p) * math.log2(float(p)) for p in row if p > 0)
    return {"self": self_w, "previous": prev, "first": first, "entropy_bits": ent / T}


def build(ctx) -> Section:
    sec = Section(8, "Attention, made visible", "attention")
    maps = ctx.results.get("maps") or []
    trained = ctx.results.get("train_run") is not None
    sentence = ctx.results.get("sentence", ctx.options.sentence)
    if not maps:
        sec.text(f"No attention maps: {ctx.results.get('maps_skip_reason', 'the model has no self-attention maps')}.")
        return sec
    state = ("the model trained above" if trained else
             "an **untrained** model (random weights: " + (ctx.results.get("train_skip_reason") or "no training run")
             + ") — its heads have learnt nothing, so the maps show the causal mask and noise, not language")
    sec.text(f"Attention weights on the sentence `{sentence}` ({len(maps[0].labels)} tokens), of {state}. Each panel: "
             "rows are queries (the token attending), columns keys (the token attended to); a decoder's causal mask "
             "leaves the upper triangle empty.")
    layers = sorted({m.layer for m in maps})
    sec.figure("attention", plots.attention_grid(maps, f"{'trained' if trained else 'untrained'} model: layers "
                                                 f"{', '.join(str(li + 1) for li in layers)} of {maps[0].n_layers}"),
               f"Attention heat maps ({'trained' if trained else 'untrained'} model), one per (layer, head), on one "
               "square-root colour scale from 0 to 1 so that faint, spread-out attention stays visible.")
    rows, stats = [], []
    for m in maps:
        s = head_stats(m)
        stats.append({"layer": m.layer + 1, "head": m.head + 1, **s})
        main = max(("self", "previous", "first"), key=lambda k: s[k])
        rows.append([str(m.layer + 1), str(m.head + 1), fmt.pct(s["self"]), fmt.pct(s["previous"]), fmt.pct(s["first"]),
                     f"{s['entropy_bits']:.2f}", main if s[main] > 0.5 else "spread"])
    sec.table(["layer", "head", "weight on self", "on previous token", "on first token", "entropy (bits)",
               "mostly"], rows, caption="What each head does on this sentence (averages over queries; "
                                        "'spread' when no single pattern holds half the weight)")
    ctx.data["attention"] = {"sentence": sentence, "trained": trained, "tokens": maps[0].labels, "heads": stats}
    return sec
