"""Section 12: seeing images — a real digit cut into the patch tokens a ViT reads, and where a small ViT
trained here looks when it classifies held-out digits (attention rollout of its [CLS] token).

Whatever the report's own model, this section trains its own: a 3-layer ViT on scikit-learn's 8x8 digits
(tformer.teach.digit_vit), seeded, for a fixed number of steps (about 13 s at the default, half that with
--quick; none with --no-train, and the section then says the maps are of an untrained model).
"""

from __future__ import annotations

import numpy as np

from tformer.core import fmt
from tformer.data.images import DIGIT_NAMES
from tformer.report.doc import Section
from tformer.teach import digit_vit
from tformer.teach.pictures import patches_png, rollout_png


def measure(ctx) -> dict:
    opts = ctx.options
    steps = 0 if not opts.train else (digit_vit.QUICK_STEPS if opts.quick else digit_vit.STEPS)
    ctx.say(f"training a small ViT on the digits ({steps} steps)" if steps else "drawing an untrained ViT's patches")
    return {"run": digit_vit.train_digit_vit(steps=steps, seed=opts.seed % 2**32, threads=opts.threads or 1)}


def build(ctx) -> Section:
    sec = Section(12, "Seeing images: ViT patches and attention", "vision")
    run = (ctx.results.get("vision") or {}).get("run")
    if run is None:
        sec.text("No ViT pictures: the digits model was not run.")
        return sec
    c = run.config
    shown = digit_vit.examples(run.val)
    data = digit_vit.summary(run, shown)
    first = data["shown"][0]
    sec.text(f"A Vision Transformer reads an image as a sequence: it cuts the {c.image_size}x{c.image_size} picture "
             f"into {c.patch_size}x{c.patch_size} patches, flattens each into {c.num_channels * c.patch_size ** 2} "
             f"numbers, projects them to d_model = {c.d_model} (a convolution with stride {c.patch_size}, the same "
             f"matmul as unfold + linear) and puts a learned [CLS] token in front: n = HW/P² + 1 = "
             f"**{c.image_tokens} tokens**. Below, a held-out digit from scikit-learn's scans (UCI optical digits).")
    sec.figure("vit_patches", patches_png(run.val.images[shown[0]], c.patch_size, f"a held-out {first['name']}"),
               f"One held-out digit ({first['name']}) whole, cut into {c.image_tokens - 1} patches numbered in the "
               "order they become tokens, and the token sequence with [CLS] as token 0.",
               alt=f"a handwritten {first['name']} cut into {c.image_tokens - 1} patches")
    trained = run.steps > 0
    correct = sum(s["label"] == s["predicted"] for s in data["shown"])
    if trained:
        state = (f"a {c.n_layers}-layer ViT (d_model {c.d_model}, {c.n_heads} heads) trained here for {run.steps} "
                 f"Adam steps ({fmt.seconds(run.seconds)}, seed {run.seed}): **{fmt.pct(run.accuracy)} held-out "
                 f"accuracy** on {len(run.val)} digits it never saw")
    else:
        state = ("an **untrained** ViT (--no-train: random weights, so the maps show no learnt preference and the "
                 f"accuracy, {fmt.pct(run.accuracy)}, is chance)")
    sec.text(f"Attention rollout (Abnar & Zuidema 2020) of {state}. Each layer's weights are averaged over the heads, "
             "the identity is added for the residual path and each row renormalised; multiplying the layers gives "
             "how much of the [CLS] state at the top was mixed from each input patch. The [CLS] row over the "
             "patches, laid on the patch grid, is the orange tint: the stronger, the more that patch fed the "
             "classification.")
    sec.figure("vit_rollout", rollout_png(run.val.images[shown], np.array([s["rollout"] for s in data["shown"]]),
                                          [s["label"] for s in data["shown"]], [s["predicted"] for s in data["shown"]],
                                          f"{'trained' if trained else 'untrained'} ViT: held-out accuracy "
                                          f"{fmt.pct(run.accuracy)}"),
               f"Held-out digits (top; a red title marks a wrong answer, {correct} of {len(shown)} right here) and the "
               f"[CLS] attention rollout over their patches (bottom), each map scaled to its largest patch.",
               alt="held-out digits with the ViT's attention rollout laid over them")
    sec.table(["digit", "read as", "largest patch share", "patch (token)"],
              [[s["name"], DIGIT_NAMES[s["predicted"]], fmt.pct(_top(s["rollout"])[0]),
                str(_top(s["rollout"])[1])] for s in data["shown"]],
              caption="The [CLS] row of the rollout: the patch it draws most from (tokens numbered as above)")
    data["trained"] = trained
    ctx.data["vision"] = data
    return sec


def _top(grid: list[list[float]]) -> tuple[float, int]:
    """The largest share in a rollout grid and its token number (patches 1.., row-major; [CLS] is 0)."""
    flat = [v for row in grid for v in row]
    best = max(range(len(flat)), key=flat.__getitem__)
    return flat[best], best + 1
