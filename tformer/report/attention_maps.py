"""Heat maps of a model's attention weights on one sentence (the report's "Attention, made visible").

One figure per (layer, head): rows are queries, columns are keys, each tick labelled with the
token it stands for. Figures are built with matplotlib's object API on an Agg canvas, never
through pyplot, so nothing needs a display and no global figure registry grows (a report makes
dozens of these).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tformer.core.atomic import atomic_path, make_dir
from tformer.core.errors import TformerError
from tformer.generate.inputs import prompt_ids

# Characters a tick label cannot show as themselves; visible stand-ins keep "a b" from reading "ab".
_VISIBLE = {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


@dataclass
class HeadMap:
    layer: int  # 0-based layer index
    head: int  # 0-based head index
    n_layers: int
    n_heads: int
    weights: torch.Tensor  # (T, T) float32 on the CPU: row = query, column = key
    labels: list[str]  # one visible label per token


def token_labels(tokenizer, ids: list[int]) -> list[str]:
    """Each id decoded on its own, with whitespace and control characters made visible."""
    labels = []
    for i in ids:
        text = tokenizer.decode([i])
        shown = "".join(_VISIBLE.get(c, c if c.isprintable() else repr(c)[1:-1]) for c in text)
        labels.append(shown or "∅")  # a token that decodes to nothing still needs a tick
    return labels


def attention_maps(model, tokenizer, sentence: str, layer: int | None = None, max_heads: int = 8) -> list[HeadMap]:
    """Run the model on ``sentence`` and return each head's weights (self-attention; the encoder's for
    an encoder-decoder). ``layer``: 0-based, negative counts from the end; None = every layer."""
    if max_heads < 1:
        raise TformerError(f"max_heads must be at least 1, got {max_heads}")
    if not tokenizer.encode(sentence):
        raise TformerError("the sentence encodes to no tokens; give a non-empty sentence")
    ids = prompt_ids(tokenizer, sentence)  # BOS first where the model was trained with it (Gemma): its attention sink
    limit = getattr(getattr(model, "config", None), "max_positions", None)
    if limit and len(ids) > limit:
        raise TformerError(f"the sentence is {len(ids)} tokens but the model takes at most {limit}; shorten it")

    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()  # dropout off: the maps show what the model computes, not a random mask of it
    try:
        with torch.no_grad():
            if model.config.traits.seq2seq:  # the maps of the encoder, which reads the text
                _, per_layer = model.encode(input_ids, None, output_attentions=True)
            else:
                per_layer = model(input_ids, output_attentions=True).attentions
    finally:
        model.train(was_training)

    n_layers = len(per_layer)
    if layer is None:
        layers = range(n_layers)
    elif -n_layers <= layer < n_layers:
        layers = [layer % n_layers]
    else:
        raise TformerError(f"layer {layer} does not exist; the model has {n_layers} layers (0..{n_layers - 1})")
    labels = token_labels(tokenizer, ids)
    maps = []
    for li in layers:
        w = per_layer[li][0].float().cpu()  # (H, T, T): batch of one
        for hi in range(min(max_heads, w.shape[0])):
            maps.append(HeadMap(li, hi, n_layers, w.shape[0], w[hi], labels))
    return maps


def heatmap_figure(m: HeadMap):
    """One head's map: weights on a fixed 0..1 colour scale so heads can be compared by eye."""
    # deferred: matplotlib loads only when a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    T = len(m.labels)
    side = min(12.0, 2.5 + 0.28 * T)  # room for every tick label, capped for long sentences
    fig = Figure(figsize=(side + 1.2, side))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(m.weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    font = 9 if T <= 24 else max(4, int(9 * 24 / T))
    long_labels = max(len(label) for label in m.labels) > 2  # subword tokens: turn them to fit
    ax.set_xticks(range(T), m.labels, fontsize=font, rotation=90 if long_labels else 0)
    ax.set_yticks(range(T), m.labels, fontsize=font)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(f"layer {m.layer + 1} of {m.n_layers}, head {m.head + 1} of {m.n_heads}")
    fig.colorbar(image, ax=ax, label="attention weight", fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig


def attention_heatmaps(model, tokenizer, sentence: str, layer: int | None = None, max_heads: int = 8) -> list:
    """One matplotlib Figure per (layer, head), in layer then head order."""
    return [heatmap_figure(m) for m in attention_maps(model, tokenizer, sentence, layer, max_heads)]


def save_attention_heatmaps(model, tokenizer, sentence: str, out_dir, layer: int | None = None,
                            max_heads: int = 8, fmt: str = "png") -> list[Path]:
    """Write one file per head, ``layer{L}_head{H}.{fmt}`` (1-based like the titles); returns the paths."""
    if fmt not in ("png", "svg"):
        raise TformerError(f"heat maps are written as png or svg, not {fmt!r}")
    out_dir = make_dir(out_dir, "--out")
    paths = []
    for m in attention_maps(model, tokenizer, sentence, layer, max_heads):
        path = out_dir / f"layer{m.layer + 1}_head{m.head + 1}.{fmt}"
        with atomic_path(path) as tmp:  # an OS error is a WriteError naming the file
            heatmap_figure(m).savefig(tmp, format=fmt, dpi=100)
        paths.append(path)
    return paths
