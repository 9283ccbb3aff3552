"""`tformer count` for models that read images (ViT, CLIP): the token count n = HW/P^2 + 1, a table of cost
against image size and patch size, CLIP's N x N logits, and the cost of fusing an image and a text three ways
(not a command itself; count.py calls it)."""

from __future__ import annotations

from dataclasses import replace

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.core.inputs import whole
from tformer.cost.fusion import fusion_costs, fusion_scaling, towers
from tformer.cost.vision import image_size_table, logits_bytes, token_formula


def add_image_arguments(parser) -> None:
    g = parser.add_argument_group("images (arch vit and clip)")
    g.add_argument("--image-size", metavar="PX[,PX...]", help="image side in pixels; several: a table of cost against "
                                                                "image size (e.g. 224,384,512)")
    g.add_argument("--patch-size", metavar="P[,P...]", help="patch side in pixels; several: a table (e.g. 16,32)")
    g.add_argument("--sweep", action="store_true", help="the table at image sizes 224, 384, 512 and patch sizes 16, 32")
    g.add_argument("--fusion", action="store_true", help="CLIP: early, late and cross-attention fusion of its towers")
    g.add_argument("--cross-every", type=int, default=1, metavar="K", help="--fusion: cross-attention in every K-th "
                                                                            "text layer (default 1)")


MAX_PIXELS = 10 ** 6  # an image side; its token count squares it, so beyond this the ledger runs past float64


def _sizes(text, flag):
    if text is None:
        return None
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise TformerError(f"{flag} takes whole numbers of pixels separated by commas, e.g. {flag} 224,384; "
                           f"got '{text}'")
    return [whole(x, flag, 1, MAX_PIXELS, note="pixels") for x in out]


def image_request(args, config):
    """(config at the one size asked for, or as it is; the sizes of a table, or None). Bad sizes: one line."""
    images = _sizes(args.image_size, "--image-size")
    patches = _sizes(args.patch_size, "--patch-size")
    asked = images or patches or args.sweep or args.fusion
    if asked and not config.traits.images:
        raise TformerError(f"{config.traits.label} reads no images; --image-size, --patch-size, --sweep and --fusion "
                           "apply to arch='vit' and 'clip' (e.g. --preset vit-base-16)")
    if args.fusion and not config.traits.two_towers:
        raise TformerError("--fusion joins a CLIP model's two towers; use a clip preset (e.g. --preset clip-vit-b-32)")
    if args.sweep:
        images, patches = images or [224, 384, 512], patches or [16, 32]
    if (images and len(images) > 1) or (patches and len(patches) > 1) or args.sweep:
        return config, (images, patches)
    changes = {k: v[0] for k, v in (("image_size", images), ("patch_size", patches)) if v}
    return (config.replace(**changes) if changes else config), None


def image_summary(lg) -> dict:
    """The figures an image model adds to `tformer count`: its tokens (with the formula), and CLIP's N x N logits."""
    c, w = lg.config, lg.workload
    out = {"image_size": c.image_size, "patch_size": c.patch_size, "num_channels": c.num_channels,
           "tokens": c.image_tokens, "formula": token_formula(c)}
    if c.traits.two_towers:
        out["contrastive"] = {"pairs": w.batch, "logits_bytes": logits_bytes(lg),
                              "rule": f"N x N x bytes = {w.batch}^2 x {logits_bytes(lg) // (w.batch * w.batch)} B"}
    return out


def print_image_header(con, lg) -> None:
    c, w = lg.config, lg.workload
    s = image_summary(lg)
    text = f", text {w.seq} tokens (seq sizes the text tower only)" if c.traits.two_towers else \
        " (seq is not what sizes a ViT: the image is; --seq is not read)"
    con.print(f"image {c.image_size}x{c.image_size}x{c.num_channels}, patch {c.patch_size}: {s['formula']} tokens "
              f"per image{text}")
    if c.traits.two_towers:
        k = s["contrastive"]
        con.print(f"contrastive batch N = {w.batch} pairs: the N x N similarity logits take "
                  f"{fmt.nbytes_gb(k['logits_bytes'])} ({k['rule']}); they grow as N^2")


def size_table(con, config, workload, sizes) -> dict:
    from rich.table import Table  # deferred: --json output never loads rich

    table = image_size_table(config, workload, *sizes)
    if con is None:
        return table
    t = Table(title=f"{getattr(config, 'name', 'custom')}: cost against image size and patch size "
                    f"({workload.phase}, batch {workload.batch}; ratios to the first row)")
    for col in ("image", "patch", "grid", "tokens n", "params", "forward matmul", "attention (QK^T, AV)", "rest",
                "attention share", "attention / first", "n^2 / first", "rest / first", "n / first", "memory"):
        t.add_column(col, justify="left" if col in ("image", "patch") else "right")
    for r in table["rows"]:
        ratio = f"{r['attention_ratio']:.3f}" if r["attention_ratio"] is not None else "-"
        t.add_row(f"{r['image_size']}px", f"{r['patch_size']}px", f"{r['grid']}x{r['grid']}", f"{r['tokens']:,}",
                  fmt.params(r["params"]), fmt.flops(r["forward_matmul_flops"]), fmt.flops(r["attention_flops"]),
                  fmt.flops(r["other_matmul_flops"]), f"{r['attention_share']:.1%}", ratio,
                  f"{r['tokens_squared_ratio']:.3f}", f"{r['other_ratio']:.3f}", f"{r['tokens_ratio']:.3f}",
                  fmt.nbytes_gb(r["memory_total"]))
    con.print(t)
    con.print("[dim]n = HW/P^2 + 1. The attention cores (Q K^T, weights x V) grow as n^2, every other matmul as n "
              "(the patch projection, 2 HW C P^2 d / P^2, not at all with P); the position table has n rows, so "
              "the parameters move too." + (f" Skipped (patch does not divide): {', '.join(table['skipped'])}."
                                            if table["skipped"] else "") + "[/]")
    return table


def fusion_table(con, config, workload, every: int) -> dict:
    from rich.table import Table  # deferred: --json output never loads rich

    vision, text = towers(config)
    work = replace(workload, phase="forward")
    costs = [f.to_dict() for f in fusion_costs(vision, text, work, every)]
    scaling = fusion_scaling(vision, text, work, every)
    out = {"modes": costs, "scaling": scaling}
    if con is None:
        return out
    N = workload.batch
    t = Table(title=f"Fusing an image ({costs[0]['n_image']} tokens) and a text ({costs[0]['n_text']} tokens): "
                    f"{N} pair(s); memory of a {workload.dtype} {workload.optimizer} training step")
    for col in ("mode", "how", "params", "forward FLOPs", "attention share", "memory", "activations",
                f"score {N}x{N} pairs", "image side x2", "text x2"):
        t.add_column(col, justify="left" if col in ("mode", "how") else "right")
    for c, s in zip(costs, scaling):
        t.add_row(c["mode"], c["how"], fmt.params(c["params"]), fmt.flops(c["forward_flops"]),
                  f"{c['attention_share']:.1%}", fmt.nbytes_gb(c["memory"]), fmt.nbytes_gb(c["activations"]),
                  fmt.flops(c["score_all_flops"]), f"{s['image_x2_ratio']:.2f}x", f"{s['text_x2_ratio']:.2f}x")
    con.print(t)
    for c in costs:
        con.print(f"[dim]{c['mode']}: {c['scaling']}[/]")
    return out
