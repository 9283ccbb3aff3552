"""BERT's masked-language-model corruption (Devlin et al. 2018, section 3.1).

Choose 15% of the (non-special) positions as prediction targets. Of those, 80% become [MASK], 10%
become a random token, and 10% stay as they are: the model cannot tell which inputs are
corrupted, so it must keep a good representation of every token, not only of [MASK]. Labels are
the original ids at the chosen positions and ``ignore_index`` elsewhere, so the loss covers only
the chosen positions.
"""

from __future__ import annotations

import torch

from tformer.core.errors import TformerError


def mask_tokens(input_ids: torch.Tensor, mask_id: int, vocab_size: int, generator: torch.Generator | None = None,
                probability: float = 0.15, special_ids=(), ignore_index: int = -100,
                mask_fraction: float = 0.8, random_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (corrupted inputs, labels); ``input_ids`` is left unchanged.

    ``special_ids`` (pad, [CLS], [SEP], ...) are never chosen. Random replacements are drawn
    uniformly from the whole vocabulary, as BERT and Hugging Face do. Every draw comes from
    ``generator``, so a seed fixes the corruption.
    """
    if mask_id is None:
        raise TformerError("this tokenizer has no mask token; masked-LM training needs one (use wordpiece or bpe)")
    if not 0 < probability < 1 or mask_fraction + random_fraction > 1:
        raise TformerError(f"masking probability must be in (0, 1) and mask+random fractions at most 1; got "
                           f"{probability}, {mask_fraction}, {random_fraction}")
    device = input_ids.device
    shape = input_ids.shape

    def uniform():
        return torch.rand(shape, generator=generator, device=device)

    candidates = torch.ones(shape, dtype=torch.bool, device=device)
    for sid in special_ids:
        if sid is not None:
            candidates &= input_ids != sid
    chosen = (uniform() < probability) & candidates
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, ignore_index))

    # One draw per position splits the chosen ones 80 / 10 / 10.
    u = uniform()
    to_mask = chosen & (u < mask_fraction)
    to_random = chosen & (u >= mask_fraction) & (u < mask_fraction + random_fraction)
    inputs = input_ids.clone()
    inputs[to_mask] = mask_id
    random_ids = torch.randint(0, vocab_size, shape, generator=generator, device=device, dtype=input_ids.dtype)
    inputs[to_random] = random_ids[to_random]
    return inputs, labels
