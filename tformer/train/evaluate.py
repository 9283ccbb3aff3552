"""Held-out evaluation of a sequence-to-sequence model by decoding: exact match and BLEU.

Loss says how well the model scores the reference; these say how good its own output is,
which is what a user of a translation model sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.generate import generate


@dataclass
class DecodeScores:
    pairs: int
    exact_match: float  # fraction of outputs identical to the reference
    bleu: float | None  # corpus BLEU (sacrebleu, 13a tokenisation), for text; None for synthetic ids
    examples: list[tuple[str, str, str]]  # (source, reference, hypothesis)


def decode_scores(model, pairs, tokenizer=None, limit: int = 200, batch_size: int = 32,
                  max_new_tokens: int = 64, num_beams: int = 1) -> DecodeScores:
    """Greedy (or beam) decode the first ``limit`` (source ids, target ids) pairs and score them."""
    pairs = pairs[:limit]
    eos = model.config.eos_token_id
    hyps, refs, srcs = [], [], []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        sources = [list(s) + [eos] for s, _ in chunk]  # the encoder saw source + EOS in training
        out = generate(model, sources, max_new_tokens=max_new_tokens, num_beams=num_beams, stop_tokens=[eos])
        for (s, t), seq in zip(chunk, out.sequences):
            hyps.append([x for x in seq if x != eos])
            refs.append(list(t))
            srcs.append(list(s))
    exact = sum(h == r for h, r in zip(hyps, refs)) / max(len(pairs), 1)
    bleu = None
    if tokenizer is not None:
        # deferred on purpose: heavy, loaded only when used
        import sacrebleu

        text = lambda ids: tokenizer.decode(ids, skip_special=True)
        hyp_text, ref_text = [text(h) for h in hyps], [text(r) for r in refs]
        bleu = sacrebleu.corpus_bleu(hyp_text, [ref_text]).score
        examples = [(text(s), r, h) for s, r, h in zip(srcs[:5], ref_text[:5], hyp_text[:5])]
    else:
        examples = [(str(s), str(r), str(h)) for s, r, h in zip(srcs[:5], refs[:5], hyps[:5])]
    return DecodeScores(len(pairs), exact, bleu, examples)
