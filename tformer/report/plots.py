"""The report's plots as PNG bytes. matplotlib's object API on an Agg canvas (never pyplot): no
display needed, no global figure registry, nothing left open between plots."""

from __future__ import annotations

import io

PHASE_STYLE = {"train": ("o", "#1f77b4"), "prefill": ("s", "#2ca02c"), "decode": ("^", "#d62728"),
               "forward": ("s", "#2ca02c")}
DPI = 100


def _figure(width: float = 7.5, height: float = 4.4):
    # deferred: matplotlib loads only when a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def to_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def matmul_curve(curves: dict[str, list[tuple[int, float]]], theoretical: dict[str, float], device: str) -> bytes:
    """Measured matmul FLOP/s against size n, one line per dtype, the theoretical peak dashed."""
    fig = _figure()
    ax = fig.add_subplot()
    colors = {}
    for dtype, pts in sorted(curves.items()):
        pts = sorted(pts)
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{dtype} measured")
        colors[dtype] = line.get_color()
    for dtype, value in theoretical.items():
        if value and dtype in colors:
            ax.axhline(value, ls="--", lw=1, color=colors[dtype], label=f"{dtype} theoretical")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("matrix size n (n x n @ n x n)")
    ax.set_ylabel("FLOP/s (2 per multiply-add)")
    ax.set_title(f"Matmul throughput vs size on {device}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return to_png(fig)


def roofline(roofs: list[dict], points: list[dict], measured: list[dict], dtype: str) -> bytes:
    """Roofs (label, peak, bandwidth, style) and ops at (intensity, FLOP/s).

    ``points``: predicted attainable rate of each op (FLOPs / predicted time) per phase;
    ``measured``: ops of the profiled step at their measured rate (hollow markers).
    """
    fig = _figure(8.5, 5.2)
    ax = fig.add_subplot()
    xs = [p["intensity"] for p in points + measured if p["intensity"]]
    lo = min(xs + [0.1]) / 3
    hi = max(xs + [r["peak"] / r["bandwidth"] for r in roofs if r.get("bandwidth") and r.get("peak")] + [10]) * 3
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for r in roofs:
        peak, bw = r.get("peak"), r.get("bandwidth")
        style = dict(color=r.get("color", "k"), ls=r.get("ls", "-"), lw=2)
        if peak and bw:
            ax.plot(grid, [min(peak, bw * x) for x in grid], label=f"{r['label']} (ridge {peak / bw:.3g} FLOP/B)", **style)
        elif peak:
            ax.axhline(peak, label=f"{r['label']} (bandwidth unknown: compute roof only)", **style)
    for phase in ("train", "prefill", "forward", "decode"):
        sel = [p for p in points if p["phase"] == phase and p["intensity"] and p["rate"]]
        if sel:
            marker, color = PHASE_STYLE[phase]
            ax.scatter([p["intensity"] for p in sel], [p["rate"] for p in sel], marker=marker, color=color, s=22,
                       alpha=0.75, label=f"{phase} ops (predicted)", zorder=3)
    sel = [p for p in measured if p["intensity"] and p["rate"]]
    if sel:
        ax.scatter([p["intensity"] for p in sel], [p["rate"] for p in sel], marker="o", facecolors="none",
                   edgecolors="#ff7f0e", s=36, label="train ops (measured)", zorder=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel(f"FLOP/s ({dtype})")
    ax.set_title("Roofline: attainable FLOP/s = min(peak, bandwidth x intensity)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="lower right")
    return to_png(fig)


def loss_curve(records: list[dict], title: str) -> bytes:
    fig = _figure(7.5, 4.0)
    ax = fig.add_subplot()
    train = [(r["step"], r["train_loss"]) for r in records if "train_loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="train loss", marker=".")
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], label="validation loss", marker="o")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return to_png(fig)


def decode_curve(rows: list[dict]) -> bytes:
    """Seconds per generated token against context n: measured and predicted, with and without cache."""
    fig = _figure(7.5, 4.4)
    ax = fig.add_subplot()
    n = [r["context"] for r in rows]
    series = (("measured_cache_s", "with KV cache, measured", "#1f77b4", "-", "o"),
              ("predicted_cache_s", "with KV cache, predicted", "#1f77b4", "--", None),
              ("measured_nocache_s", "without cache, measured", "#d62728", "-", "s"),
              ("predicted_nocache_s", "without cache, predicted", "#d62728", "--", None))
    for key, label, color, ls, marker in series:
        ys = [r.get(key) for r in rows]
        if all(isinstance(y, float) for y in ys):
            ax.plot(n, [y * 1e3 for y in ys], ls=ls, color=color, marker=marker, label=label)
    ax.set_xlabel("context n (tokens already seen)")
    ax.set_ylabel("ms per new token (batch 1)")
    ax.set_title("Decode cost vs context length")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return to_png(fig)


def memory_per_device(series: dict[str, list[tuple[int, float]]], capacity: float | None, capacity_label: str,
                      title: str) -> bytes:
    """Bytes per device (GiB) against the device count, one line per layout family; ``capacity`` (the
    named device's memory) as a dashed line when given."""
    fig = _figure(7.5, 4.4)
    ax = fig.add_subplot()
    for (label, pts), marker in zip(series.items(), "osD^vx<>"):
        ax.plot([n for n, _ in pts], [b / 2**30 for _, b in pts], marker=marker, label=label)
    if capacity:
        ax.axhline(capacity / 2**30, ls="--", lw=1, color="k", label=capacity_label)
    ax.set_xscale("log", base=2)
    counts = sorted({n for pts in series.values() for n, _ in pts})
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_yscale("log")
    ax.set_xlabel("devices")
    ax.set_ylabel("training memory per device (GiB)")
    # deferred: matplotlib loads only when a figure is drawn
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _pos: f"{v:g}")  # 60, not 6 x 10^1
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return to_png(fig)


def kind_bars(rows: list[tuple[str, float, float]], title: str) -> bytes:
    """Predicted vs measured seconds per op kind (horizontal bars, log scale)."""
    height = max(3.0, 0.32 * len(rows) + 1.2)
    fig = _figure(7.5, height)
    ax = fig.add_subplot()
    ys = range(len(rows))
    ax.barh([y + 0.2 for y in ys], [r[1] * 1e3 for r in rows], height=0.4, label="predicted", color="#9ecae1")
    ax.barh([y - 0.2 for y in ys], [r[2] * 1e3 for r in rows], height=0.4, label="measured", color="#3182bd")
    ax.set_yticks(list(ys), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ms per step")
    ax.set_title(title)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return to_png(fig)


def loglog_by_kind(series: dict[str, dict], ylabel: str, title: str) -> bytes:
    """One colour per kind against n, both axes log: measured points (markers, solid) and the
    ledger's prediction (dashed). ``series``: kind -> {"measured": [(n, y)], "predicted": [(n, y)]}."""
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot()
    # Twelve kinds outrun the default ten-colour cycle: pair colours (tab20) with markers so no two kinds look alike.
    from matplotlib import colormaps  # deferred: matplotlib loads only when a figure is drawn

    palette, markers = colormaps["tab20"].colors, "osD^v<>ph*XP"  # tab20: strong and light of each hue in turn
    for i, (kind, pts) in enumerate(series.items()):
        measured, predicted = sorted(pts.get("measured", [])), sorted(pts.get("predicted", []))
        color = palette[(2 * i) % len(palette) + (i * 2 // len(palette)) % 2]
        if measured:
            ax.plot([n for n, _ in measured], [y for _, y in measured], marker=markers[i % len(markers)], ms=4,
                    color=color, label=f"{kind} measured")
        if predicted:
            ax.plot([n for n, _ in predicted], [y for _, y in predicted], ls="--", lw=1, color=color,
                    label=f"{kind} predicted")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return to_png(fig)


def curves_by_model(series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str, title: str,
                    log_y: bool = False, floor: tuple[float, str] | None = None) -> bytes:
    """One line per label against x (log base 2), y linear or log; a label ending in "init" is dashed
    (a model before training beside itself after). ``floor``: (y, label) drawn as a dotted line (chance)."""
    fig = _figure(7.5, 4.4)
    ax = fig.add_subplot()
    for (label, pts), marker in zip(series.items(), "osD^v<>"):
        pts = sorted(pts)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker=marker, ms=3,
                ls="--" if label.endswith("init") else "-", label=label)
    if floor:
        ax.axhline(floor[0], ls=":", lw=1, color="k", label=floor[1])
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return to_png(fig)


def attention_grid(maps, title: str) -> bytes:
    """Every (layer, head) map of ``maps`` (tformer.report.attention_maps.HeadMap) in one grid:
    rows are layers, columns heads, all on one 0..1 colour scale, every token labelled."""
    # deferred: matplotlib loads only when a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure

    layers = sorted({m.layer for m in maps})
    heads = sorted({m.head for m in maps})
    T = len(maps[0].labels)
    cell = min(4.0, max(2.2, 0.075 * T + 0.6))  # room for one readable tick label per token
    fig = Figure(figsize=(cell * len(heads) + 0.9, cell * len(layers) + 0.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(layers), len(heads), squeeze=False)
    image = None
    font = 6 if T <= 48 else max(3, int(6 * 48 / T))
    for m in maps:
        ax = axes[layers.index(m.layer)][heads.index(m.head)]
        # Square-root colour scale: a head spreading 1/T over T keys is still visible, not black.
        image = ax.imshow(m.weights.numpy(), cmap="viridis", norm=PowerNorm(0.5, vmin=0.0, vmax=1.0),
                          interpolation="nearest")
        ax.set_title(f"layer {m.layer + 1}, head {m.head + 1}", fontsize=9)
        ax.set_xticks(range(T), m.labels, fontsize=font)
        ax.set_yticks(range(T), m.labels, fontsize=font)
        ax.tick_params(length=0, pad=1)
    fig.suptitle(title, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes, fraction=0.025, pad=0.01, label="attention weight (square-root scale)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


__all__ = ["attention_grid", "curves_by_model", "decode_curve", "kind_bars", "loglog_by_kind", "loss_curve",
           "matmul_curve", "memory_per_device", "roofline", "to_png"]
