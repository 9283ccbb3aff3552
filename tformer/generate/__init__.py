"""Generation: greedy, sampling (temperature, top-k, top-p, min-p, repetition penalty) and beam
search, with or without the KV cache, for decoder-only and encoder-decoder models.

    from tformer.generate import generate
    out = generate(model, [[5, 6, 7], [8, 9]], max_new_tokens=20)           # greedy, left-padded batch
    out = generate(model, ids, do_sample=True, top_p=0.9, temperature=0.8, seed=0)
    out = generate(model, src_ids, num_beams=4, length_penalty=0.6)          # encoder-decoder: translate
    for tokens in stream(model, ids, max_new_tokens=50): ...                  # (B,) tokens per step
"""

from tformer.generate.sampling import (
    apply_temperature,
    min_p_filter,
    process_logits,
    repetition_penalty,
    sample,
    top_k_filter,
    top_p_filter,
)
from tformer.generate.search import (
    GenerationConfig,
    GenerationOutput,
    generate,
    pad_batch,
    stream,
)
from tformer.model.runners import positions_from_mask

__all__ = [
    "generate", "stream", "GenerationConfig", "GenerationOutput",
    "pad_batch", "positions_from_mask", "apply_temperature", "top_k_filter", "top_p_filter", "min_p_filter",
    "repetition_penalty", "process_logits", "sample",
]
