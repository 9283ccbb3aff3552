"""The batch a training source gives a runner's loss, and a stand-in batch of the right shape for timing and tests.

A ``Batch`` is the model's forward keywords plus what the loss scores them against. Which keywords and which targets
depend on what the model trains on (its record's objective, or the task head in its config), not on the runner:
``example_batch`` builds one for each objective, as the training sources (tformer.train.sources) would, from token
ids alone (images are drawn from a fixed seed). It is a training helper: the runner reads batches, never makes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Batch:
    """One batch as the training sources produce it."""

    inputs: dict[str, torch.Tensor]  # keyword arguments of the model's forward
    targets: torch.Tensor  # (B, T) token ids; -100 = not scored. An image classifier's (B,) classes; CLIP's (B,) 0..B-1
    pair_targets: torch.Tensor | None = None  # (B,) NSP / SOP class of each row (the pair head's target)

    def shard(self, rank: int, world: int) -> Batch:
        """This rank's rows of a global batch (rows are split evenly, in order)."""
        if world == 1:
            return self
        rows = self.targets.shape[0] // world
        part = slice(rank * rows, (rank + 1) * rows)
        pair = self.pair_targets[part] if self.pair_targets is not None else None
        return Batch({k: v[part] for k, v in self.inputs.items()}, self.targets[part], pair)

    def to(self, device) -> Batch:
        pair = self.pair_targets.to(device) if self.pair_targets is not None else None
        return Batch({k: v.to(device) for k, v in self.inputs.items()}, self.targets.to(device), pair)


def _tokens(config, ids, decoder_ids) -> Batch:
    """Causal and masked LMs: each position predicts itself (a stand-in: no shift, no masking)."""
    return Batch({"input_ids": ids}, ids)


def _seq2seq(config, ids, decoder_ids) -> Batch:
    """The source is ``ids``; the target (teacher-forced decoder input) is ``decoder_ids``, else ``ids`` again."""
    target = decoder_ids if decoder_ids is not None else ids
    return Batch({"input_ids": ids, "decoder_input_ids": target}, target)


def _images(config, ids: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """(B, C, H, W) pixels drawn from ``g``, one image per row of ``ids`` (their length is ignored: an image is
    n = HW/P^2 + 1 tokens)."""
    pixels = torch.randn(ids.shape[0], config.num_channels, config.image_size, config.image_size, generator=g)
    return pixels.to(ids.device)


def _image_classes(config, ids, decoder_ids) -> Batch:
    g = torch.Generator().manual_seed(0)
    pixels = _images(config, ids, g)
    labels = torch.randint(0, max(config.n_classes, 1), (ids.shape[0],), generator=g)
    return Batch({"pixel_values": pixels}, labels.to(ids.device))


def _image_text_pairs(config, ids, decoder_ids) -> Batch:
    """Image i with text i (``ids``, each ending in the end token): the targets are 0..B-1 both ways."""
    texts = ids.clone()
    if config.eos_token_id is not None:
        texts[:, -1] = config.eos_token_id
    return Batch({"pixel_values": _images(config, ids, torch.Generator().manual_seed(0)), "input_ids": texts},
                 torch.arange(ids.shape[0], device=ids.device))


def _task_labels(config, ids, decoder_ids) -> Batch:
    """Labels of a task head's shape: a span (start, end) per row, a class per row or per token, or a score."""
    (B, T), g = ids.shape, torch.Generator().manual_seed(0)
    if config.task == "question-answering":
        targets = torch.randint(0, T, (B, 2), generator=g)
    elif config.n_classes == 1:
        targets = torch.randn(B, generator=g)
    else:
        targets = torch.randint(0, config.n_classes, (B, T) if config.task == "token-classification" else (B,),
                                generator=g)
    return Batch({"input_ids": ids}, targets.to(ids.device))


_BY_OBJECTIVE: dict[str, Callable[..., Batch]] = {
    "causal": _tokens, "mlm": _tokens, "seq2seq": _seq2seq,
    "image-classification": _image_classes, "contrastive": _image_text_pairs,
}


def example_batch(config, ids: torch.Tensor, decoder_ids: torch.Tensor | None = None) -> Batch:
    """The batch a training source would give a model of ``config`` for these (B, T) token ids (for timing and tests,
    not learning). ``decoder_ids``: a seq2seq model's target."""
    if config.task:
        return _task_labels(config, ids, decoder_ids)
    return _BY_OBJECTIVE[config.traits.objective](config, ids, decoder_ids)


__all__ = ["Batch", "example_batch"]
