"""`tformer attention --vit`: how a ViT turns a real digit into tokens, and where a small ViT trained on the
digits looks (attention rollout of [CLS]), printed step by step and saved as the report's two pictures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.text import Text

from tformer.core.atomic import atomic_path, make_dir
from tformer.teach import digit_vit
from tformer.teach.digit_vit import DigitViT
from tformer.teach.pictures import patches_png, rollout_png
from tformer.teach.render import _table

PICTURES = ("vit_patches.png", "vit_rollout.png")


def save_pictures(run: DigitViT, out_dir) -> list[Path]:
    """The report's two pictures for ``run``, written atomically into ``out_dir`` (created if missing)."""
    out = make_dir(out_dir, "--out")
    shown = digit_vit.examples(run.val)
    preds, maps = digit_vit.predict(run.model, run.val.images[shown])
    images = [patches_png(run.val.images[shown[0]], run.config.patch_size, f"a held-out digit {run.val.labels[shown[0]]}"),
              rollout_png(run.val.images[shown], maps, run.val.labels[shown], preds,
                          f"held-out accuracy {100 * run.accuracy:.1f}% after {run.steps} steps")]
    paths = []
    for name, png in zip(PICTURES, images):
        with atomic_path(out / name) as tmp:  # an OS error is a WriteError naming the file
            tmp.write_bytes(png)
        paths.append(out / name)
    return paths


def to_dict(run: DigitViT) -> dict:
    """summary() plus the first shown digit's pixels and patch tokens: everything the text shows."""
    data = digit_vit.summary(run)
    image = run.val.images[data["shown"][0]["index"]]
    data["pixels"] = image[0].tolist()
    data["patch_tokens"] = digit_vit.patch_tokens(image, run.config.patch_size).tolist()
    return data


def render(run: DigitViT, data: dict, saved: list[Path] | None, console: Console | None = None) -> None:
    console = console or Console()

    def p(line="", bold: str = "") -> None:
        """A line of text (never parsed as markup: "[CLS]" must print as itself) or a table."""
        if isinstance(line, str):
            line = Text.assemble((bold, "bold"), line) if bold else Text(line)
        console.print(line)
    c = run.config
    P, side = c.patch_size, c.image_size
    rows = side // P
    first = data["shown"][0]
    levels = (np.array(data["pixels"]) * 16).round().astype(int).tolist()  # the scans' own 0-16 grey levels
    p(bold="A Vision Transformer reads an image, step by step")
    p(f"  a held-out {first['name']} from scikit-learn's 8x8 digit scans (UCI optical digits), grey levels 0-16 (16 = ink)")
    p(bold=f"\nStep 1. The image ({side}x{side} pixels, {c.num_channels} channel)")
    cols = [str(j + 1) for j in range(side)]
    p(_table("pixels", levels, cols, cols, 0))
    p(bold=f"\nStep 2. Cut into {P}x{P} patches", line=f": {rows} x {rows} = {rows * rows} patches, numbered row by "
      "row: the order they become tokens")
    grid = [[t * rows + q + 1 for q in range(rows)] for t in range(rows)]
    p(_table("token of patch", grid, [str(r + 1) for r in range(rows)], [str(q + 1) for q in range(rows)], 0))
    width = c.num_channels * P * P
    p(bold=f"\nStep 3. Each patch flattened to {width} numbers", line=f", then multiplied by a {width}x{c.d_model} "
      f"matrix: the patch projection (a convolution with stride {P} computes the same)")
    tokens = (np.array(data["patch_tokens"]) * 16).round().astype(int).tolist()
    p(_table("patch tokens", tokens, [str(t + 1) for t in range(len(tokens))],
             [f"p{k + 1}" for k in range(width)], 0))
    p(bold="\nStep 4. [CLS] in front", line=f": n = HW/P² + 1 = {side}·{side}/{P}² + 1 = {c.image_tokens} tokens; "
      "learned positions are added and the encoder reads them like words. The class is read off [CLS] at the top.")
    state = (f"trained here for {run.steps} Adam steps ({run.seconds:.1f} s, seed {run.seed})" if run.steps
             else "untrained (--steps 0)")
    p(bold="\nStep 5. A small ViT", line=f" ({c.n_layers} layers, d_model {c.d_model}, {c.n_heads} heads), {state}: "
      f"held-out accuracy {100 * run.accuracy:.1f}% on {len(run.val)} digits; this {first['name']} is read as "
      f"{first['predicted']}")
    p(bold="\nStep 6. Attention rollout of [CLS]", line=" (Abnar & Zuidema 2020): Â_l = rows renormalised of "
      f"(mean over heads of A_l + I), R = Â_{c.n_layers} ··· Â_1; the [CLS] row of R over the patches, in %:")
    shares = (np.array(first["rollout"]) * 100).round(1).tolist()
    p(_table("[CLS] share %", shares, [str(r + 1) for r in range(rows)],
             [str(q + 1) for q in range(rows)], 1))
    flat = np.array(first["rollout"]).ravel()
    p(f"  the largest share is patch {int(flat.argmax()) + 1} ({100 * flat.max():.1f}%); the rest of [CLS] "
      f"({100 * (1 - flat.sum()):.1f}%) is its own start state")
    if saved:
        p("\nPictures: " + ", ".join(str(s) for s in saved))
    else:
        p("\nadd --out DIR to save the two pictures (the digit cut into patches; the rollout over six held-out digits)")


__all__ = ["PICTURES", "render", "save_pictures", "to_dict"]
