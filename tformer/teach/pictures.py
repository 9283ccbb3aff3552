"""The two ViT pictures as PNG bytes: a digit cut into patch tokens, and the [CLS] attention rollout over
held-out digits. matplotlib's object API on an Agg canvas (never pyplot: no display, no global figures),
loaded only when a picture is drawn."""

from __future__ import annotations

import io

import numpy as np

from tformer.teach.digit_vit import patch_tokens

INK = "gray_r"  # the digits hold ink as 1: dark strokes on white, as they were written
HEAT = (1.0, 0.3, 0.0)  # the rollout as an orange tint whose opacity is the weight: the ink stays readable
DPI = 100


def _canvas(width: float, height: float):
    # deferred: matplotlib loads only when a picture is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _bare(ax, frame: bool = False) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(frame)


def patches_png(image: np.ndarray, patch: int, title: str = "") -> bytes:
    """One (C, H, W) image: whole with the patch grid drawn on it; cut apart with a gap, each patch numbered
    with its token position; and the token sequence the encoder reads, [CLS] first."""
    c, h, w = image.shape
    rows, cols = h // patch, w // patch
    n = rows * cols + 1
    grey = image.mean(axis=0)  # one channel to show; the digits have only one
    tokens = patch_tokens(image, patch).reshape(rows * cols, c, patch, patch).mean(axis=1)
    fig = _canvas(10.5, 5.4)
    grid = fig.add_gridspec(2, 2, height_ratios=(3.2, 1.0), hspace=0.35, wspace=0.15)

    whole = fig.add_subplot(grid[0, 0])
    whole.imshow(grey, cmap=INK, vmin=0, vmax=1, interpolation="nearest")
    for k in range(1, rows):
        whole.axhline(k * patch - 0.5, color="#d62728", lw=1.2)
    for k in range(1, cols):
        whole.axvline(k * patch - 0.5, color="#d62728", lw=1.2)
    whole.set_title(f"{title + ': ' if title else ''}{h}x{w} pixels, patches of {patch}x{patch}", fontsize=10)
    _bare(whole, frame=True)

    cut = fig.add_subplot(grid[0, 1])
    gap = 0.35 * patch
    for t in range(rows * cols):
        r, q = divmod(t, cols)
        x0, y0 = q * (patch + gap), r * (patch + gap)
        cut.imshow(tokens[t], cmap=INK, vmin=0, vmax=1, interpolation="nearest",
                   extent=(x0, x0 + patch, y0 + patch, y0))
        cut.add_patch(_frame(x0, y0, patch))
        cut.text(x0 + 0.06 * patch, y0 + 0.08 * patch, str(t + 1), color="#d62728", fontsize=8, va="top",
                 ha="left", fontweight="bold", bbox=dict(facecolor="white", edgecolor="none", pad=0.6, alpha=0.85))
    cut.set_xlim(-gap / 2, cols * (patch + gap) - gap / 2)
    cut.set_ylim(rows * (patch + gap) - gap / 2, -gap / 2)
    cut.set_title(f"cut into {rows} x {cols} = {rows * cols} patches, numbered in token order", fontsize=10)
    _bare(cut)

    seq = fig.add_subplot(grid[1, :])
    step = patch * 1.25
    seq.add_patch(_frame(0, 0, patch, face="#fde7c8"))
    seq.text(patch / 2, patch / 2, "[CLS]", ha="center", va="center", fontsize=7, fontweight="bold")
    seq.text(patch / 2, patch * 1.35, "0", ha="center", va="center", fontsize=7)
    for t in range(rows * cols):
        x0 = (t + 1) * step
        seq.imshow(tokens[t], cmap=INK, vmin=0, vmax=1, interpolation="nearest", extent=(x0, x0 + patch, patch, 0))
        seq.add_patch(_frame(x0, 0, patch))
        seq.text(x0 + patch / 2, patch * 1.35, str(t + 1), ha="center", va="center", fontsize=7)
    seq.set_xlim(-0.2 * patch, n * step)
    seq.set_ylim(patch * 1.7, -0.1 * patch)
    seq.set_aspect("equal")
    seq.set_title(f"the sequence the encoder reads: n = HW/P² + 1 = {h}·{w}/{patch}² + 1 = {n} tokens", fontsize=10)
    _bare(seq)
    return _png(fig)


def _frame(x0: float, y0: float, size: float, face: str = "none"):
    # deferred: matplotlib loads only when a picture is drawn
    from matplotlib.patches import Rectangle

    return Rectangle((x0, y0), size, size, fill=face != "none", facecolor=face, edgecolor="#555555", lw=0.8)


def rollout_png(images: np.ndarray, maps: np.ndarray, labels, predicted, title: str = "") -> bytes:
    """Held-out (N, C, H, W) digits, and under each the [CLS] rollout map (N, rows, cols) laid over it,
    each map scaled to its own maximum (the share of the largest patch is printed)."""
    count, _, h, w = images.shape
    fig = _canvas(1.75 * count + 0.6, 4.3)
    axes = fig.subplots(2, count, squeeze=False)
    for i in range(count):
        grey = images[i].mean(axis=0)
        top, low = axes[0][i], axes[1][i]
        top.imshow(grey, cmap=INK, vmin=0, vmax=1, interpolation="nearest")
        ok = int(labels[i]) == int(predicted[i])
        top.set_title(f"digit {labels[i]}, read {predicted[i]}", fontsize=9, color="black" if ok else "#d62728")
        low.imshow(grey, cmap=INK, vmin=0, vmax=1, interpolation="nearest")
        tint = np.zeros(maps[i].shape + (4,))
        tint[..., :3] = HEAT
        tint[..., 3] = 0.85 * maps[i] / maps[i].max()
        low.imshow(tint, interpolation="nearest", extent=(-0.5, w - 0.5, h - 0.5, -0.5))
        low.set_title(f"top patch {100 * maps[i].max():.0f}%", fontsize=8)
        _bare(top, frame=True)
        _bare(low, frame=True)
    axes[0][0].set_ylabel("digit", fontsize=9)
    axes[1][0].set_ylabel("[CLS] rollout", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _png(fig)


__all__ = ["patches_png", "rollout_png"]
