"""A small ViT trained on the digits for a few seconds, to look inside: the picture of a digit cut into
patches, and the attention rollout of the trained model over held-out digits (the report's "Seeing
images" section and `tformer attention --vit`).

Seeded end to end (the split, the initial weights, the batches), on the CPU in float32, so the same
steps give the same model and the same pictures run after run. The loop is deliberately the plainest
one (Adam, a linear decay, no evaluation until the end): the point is the pictures, not the training;
`tformer train --task image-classification` is the full trainer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from tformer.core.config import ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.data.batch import Batch
from tformer.data.images import DIGIT_NAMES, ImageSet, digits, split
from tformer.model import build
from tformer.model.runners import runner_for
from tformer.teach.rollout import cls_map

STEPS = 800  # measured on a shared 2-core CPU at one thread: about 13 s, ~95% held out
QUICK_STEPS = 400


def digit_vit_config(n_layers: int = 3, d_model: int = 64, n_heads: int = 4, patch_size: int = 2) -> ModelConfig:
    """The vit-digits preset made smaller and finer: 8x8 grey digits in 2x2 patches (16 patch tokens + [CLS]), so
    the rollout has a grid worth looking at and a few seconds of training suffice. attn_impl='reference' so every
    layer returns its weights (rollout reads them); at 17 tokens the fused kernels would save nothing."""
    return preset("vit-digits", n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_ff=2 * d_model,
                  patch_size=patch_size, norm_eps=1e-5, dropout=0.0, attn_impl="reference")


@dataclass
class DigitViT:
    model: torch.nn.Module  # a ViTModel in eval mode, on the CPU
    config: ModelConfig
    val: ImageSet  # the held-out digits
    steps: int
    seconds: float  # wall time of the training loop
    accuracy: float  # on all of ``val``
    seed: int


def train_digit_vit(steps: int = STEPS, seed: int = 0, batch: int = 64, lr: float = 2e-3,
                    config: ModelConfig | None = None, val_fraction: float = 0.2, threads: int | None = 1) -> DigitViT:
    """Train on the digits' training split for ``steps`` Adam steps (0: the untrained model) and score the
    held-out split. The global torch RNG and thread count are left as they were. ``threads``: CPU threads
    for the run (None: PyTorch's setting); one by default, since 64-wide matmuls gain nothing from more and a
    second thread on a busy machine only waits."""
    if steps < 0:
        raise TformerError(f"steps must be 0 or more, got {steps}")
    if threads is not None and threads < 1:
        raise TformerError(f"threads must be at least 1, got {threads}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(steps, seed, batch, lr, config, val_fraction)
    finally:
        torch.set_num_threads(before)


def _train(steps: int, seed: int, batch: int, lr: float, config: ModelConfig | None, val_fraction: float) -> DigitViT:
    config = config or digit_vit_config()
    train, val = split(digits(), val_fraction, seed)
    x, y = torch.from_numpy(train.images), torch.from_numpy(train.labels)
    with torch.random.fork_rng(devices=[]):  # a seeded init without moving the caller's random stream
        torch.manual_seed(seed)
        model = build(config)
    runner = runner_for(model)
    draw = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / max(steps, 1))
    model.train()
    start = time.perf_counter()
    for _ in range(steps):
        rows = torch.randint(0, len(y), (batch,), generator=draw)
        loss = runner.loss(Batch({"pixel_values": x[rows]}, y[rows]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        decay.step()
    seconds = time.perf_counter() - start
    model.eval()
    preds, _ = predict(model, val.images)
    return DigitViT(model, config, val, steps, seconds, float((preds == val.labels).mean()), seed)


def predict(model, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(predicted class (N,), [CLS] rollout over the patch grid (N, rows, cols) float64) for (N, C, H, W) images."""
    patch = model.config.patch_size
    grid = (images.shape[2] // patch, images.shape[3] // patch)
    with torch.no_grad():
        out = model(torch.from_numpy(np.ascontiguousarray(images)), output_attentions=True)
    return out.logits.argmax(-1).numpy(), cls_map(out.attentions, grid).numpy()


def examples(val: ImageSet, count: int = 6) -> np.ndarray:
    """Indices into ``val`` of the first held-out digit of ``count`` different classes, spread over 0-9."""
    classes = np.linspace(0, len(val.classes) - 1, count).round().astype(int)
    return np.array([int(np.flatnonzero(val.labels == c)[0]) for c in classes])


def patch_tokens(image: np.ndarray, patch: int) -> np.ndarray:
    """(C, H, W) -> (rows*cols, C*P*P): the patches in token order (row-major), each flattened channel by
    channel, row by row: what the patch projection (a stride-P convolution) multiplies."""
    c, h, w = image.shape
    rows, cols = h // patch, w // patch
    blocks = image[:, :rows * patch, :cols * patch].reshape(c, rows, patch, cols, patch)
    return blocks.transpose(1, 3, 0, 2, 4).reshape(rows * cols, c * patch * patch)


def summary(run: DigitViT, shown: np.ndarray | None = None) -> dict:
    """The run and the shown digits as plain data (the report's JSON, `attention --vit --json`)."""
    shown = examples(run.val) if shown is None else shown
    preds, maps = predict(run.model, run.val.images[shown])
    c = run.config
    return {
        "config": {"image_size": c.image_size, "patch_size": c.patch_size, "num_channels": c.num_channels,
                   "n_layers": c.n_layers, "d_model": c.d_model, "n_heads": c.n_heads, "tokens": c.image_tokens},
        "steps": run.steps, "seconds": run.seconds, "seed": run.seed, "held_out": len(run.val),
        "accuracy": run.accuracy,
        "shown": [{"index": int(i), "label": int(run.val.labels[i]), "name": DIGIT_NAMES[int(run.val.labels[i])],
                   "predicted": int(p), "rollout": m.tolist()} for i, p, m in zip(shown, preds, maps)],
    }


__all__ = ["DigitViT", "QUICK_STEPS", "STEPS", "digit_vit_config", "examples", "patch_tokens", "predict", "summary",
           "train_digit_vit"]
