"""What an image costs: the token count n = HW/P^2 + 1 of a ViT (or CLIP's vision tower), the ledger at other
image and patch sizes, and the split of its FLOPs into attention's n^2 part and the rest's n part.

Nothing here is a formula of its own: every figure is a sum over a ledger's rows (tformer.cost.ledger).
"""

from __future__ import annotations

from dataclasses import replace

from tformer.core.errors import TformerError
from tformer.cost.ledger import Ledger, Workload, ledger

# The attention core's matmuls: Q K^T and the weights times V; their FLOPs grow with n^2, the rest with n.
ATTENTION_CORE_KINDS = ("scores", "context")


def token_formula(config) -> str:
    """``n = HW/P^2 + 1 = 224·224/16^2 + 1 = 197``: the tokens one image becomes, with the numbers put in."""
    s, p = config.image_size, config.patch_size
    return f"n = HW/P^2 + 1 = {s}·{s}/{p}^2 + 1 = {config.image_tokens}"


def attention_core_flops(lg: Ledger, phase: str = "forward") -> int:
    """Matmul FLOPs of the attention cores (scores and context rows) in ``phase``."""
    return lg.total(lg.select(phase=phase, kind=ATTENTION_CORE_KINDS), "matmul_flops")


def logits_bytes(lg: Ledger) -> int:
    """CLIP: the N x N similarity logits of a batch of N pairs (N^2 x the activation bytes); 0 otherwise."""
    return sum(op.bytes_written for op in lg.select(phase="forward", kind="temperature"))


def image_variants(config, image_sizes, patch_sizes) -> tuple[list, list[str]]:
    """``config`` at every (image size, patch size) pair that cuts into whole patches, and the pairs that do not."""
    if not config.traits.images:
        raise TformerError(f"{config.traits.label} reads no images; --image-size and --patch-size apply to "
                           "arch='vit' and 'clip' (e.g. --preset vit-base-16)")
    done, skipped = [], []
    for size in image_sizes or [config.image_size]:
        for patch in patch_sizes or [config.patch_size]:
            if size < patch or size % patch:
                skipped.append(f"{size}/{patch}")
                continue
            done.append(config.replace(image_size=size, patch_size=patch))
    if not done:
        raise TformerError(f"no patch size given divides an image size given ({', '.join(skipped)}); pick patch "
                           "sizes that divide the image sizes, e.g. --image-size 224,384 --patch-size 16,32")
    return done, skipped


def image_size_table(config, workload: Workload, image_sizes=None, patch_sizes=None) -> dict:
    """The ledger of ``config`` at each image size x patch size: tokens n, parameters (the position table has
    n rows, so it grows too), forward matmul FLOPs split into the attention core (about n^2) and the rest
    (about n), each as a ratio to the first row beside n^2 and n's own ratios."""
    configs, skipped = image_variants(config, image_sizes, patch_sizes)
    rows = []
    for c in configs:
        lg = ledger(c, workload)
        fwd = lg.flops["by_phase"]["forward"]["matmul"]
        att = attention_core_flops(lg)
        rows.append({"image_size": c.image_size, "patch_size": c.patch_size, "grid": c.image_size // c.patch_size,
                     "tokens": c.image_tokens, "params": lg.params["total"], "forward_matmul_flops": fwd,
                     "attention_flops": att, "other_matmul_flops": fwd - att, "flops_total": lg.flops["total"],
                     "memory_total": lg.memory["total"], "logits_bytes": logits_bytes(lg)})
    first = rows[0]
    for r in rows:
        n = r["tokens"] / first["tokens"]
        r.update(tokens_ratio=n, tokens_squared_ratio=n * n,
                 attention_ratio=r["attention_flops"] / first["attention_flops"] if first["attention_flops"] else None,
                 other_ratio=r["other_matmul_flops"] / first["other_matmul_flops"],
                 attention_share=r["attention_flops"] / r["forward_matmul_flops"])
    return {"rows": rows, "skipped": skipped, "phase": workload.phase}


def contrastive_batch(config, workload: Workload, batches=(1, 2, 4)) -> list[dict]:
    """CLIP at batch N: the N x N logits (exactly N^2 x bytes) and the training activations, whose N^2 part is
    the similarity's logits and both losses' fp32 log-probabilities."""
    if config.arch != "clip":
        raise TformerError(f"{config.traits.label} has no contrastive batch; it is CLIP's (arch='clip')")
    out = []
    for n in batches:
        lg = ledger(config, replace(workload, batch=n))
        out.append({"batch": n, "logits_bytes": logits_bytes(lg), "activations": lg.memory["activations"],
                    "memory_total": lg.memory["total"]})
    return out
