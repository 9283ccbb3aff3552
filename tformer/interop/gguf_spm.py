"""A GGUF file's SentencePiece tokenizer (``tokenizer.ggml.model == "llama"``: LLaMA 1/2, Mistral, Gemma), built
from its metadata on the HF ``tokenizers`` BPE engine, with llama.cpp's meaning.

What llama.cpp does with such a vocabulary (``src/llama-vocab.cpp``: ``tokenizer_st_partition``, then
``llm_tokenizer_spm_session``):

1. User-defined tokens (token_type 4), and control tokens (3) when special tokens are parsed, are cut out of the
   raw text first, longest token first, and stand as themselves.
2. In each remaining piece a space becomes ``▁`` (and, if ``tokenizer.ggml.add_space_prefix``, one ``▁`` goes in
   front of the piece). There is no pre-tokenizer: a piece is one word, spaces included.
3. The piece is cut into characters, and again and again the adjacent pair whose concatenation is a token with
   the highest ``tokenizer.ggml.scores`` value is merged (the leftmost pair on a tie), until no pair is a token.
4. A character that is no token is written as its UTF-8 bytes, each the token ``<0xXX>`` (byte fallback).

Step 3 is BPE whose merges are every split of every token into two tokens, ranked by the whole token's score:
that is the BPE model built here (``merges_from_scores``), so the Rust engine does the merging (measured on two
cores: Gemma 3's 262,144 tokens built in about 4 s, all of Shakespeare encoded in about 4 s, WikiText-2's test
split in under 1 s). Step 1 is the engine's added tokens (user-defined always matched, control ones only when
``encode(..., special=True)``); step 2 its normalizer; step 4 its ``byte_fallback``. Decoding
turns ``▁`` back into spaces and byte tokens into their bytes; control tokens decode as their text unless
``skip_special``, as in gguf_tokenizer.

What transformers (5.24, ``integrations/gguf/gguf_tokenizer_mapping.py``) builds for Gemma files differs in one
respect. The file stores Gemma's runs of 2 to 31 spaces as user-defined tokens spelled with real spaces (ids
138-167); transformers respells them ``▁▁``... and leaves them to BPE merges ranked by their place in the file,
where llama.cpp (and SentencePiece) match them whole in the raw text, longest first. Both give the same ids
for runs of up to 31 spaces; a longer run is 31 + the rest in llama.cpp, and a split BPE prefers in
transformers (37 spaces: 31 + 6 against 16 + 21). Measured on the Gemma 3 270M file (tests/interop/
test_gguf_spm.py, the text cut after each run of line breaks): in Shakespeare 50 of 146,552 pieces differ (353 of
1,468,947 tokens; transformers gives 14 more in all), each holding one run of 32 to 47 spaces (45 indenting a
line, mostly a speaker's name, 4 trailing one); in WikiText-2's test split none of 4,358 pieces (295,215
tokens); in the sample of hard text (unicode, emoji, code, whitespace runs, control-token text) 1 of 26, the one
with such runs. Everywhere else the ids are equal, and every difference is llama.cpp's algorithm (written out in
Python in that test) on our side and vanishes when ours is built from transformers' reading of the file.

transformers also ranks merges by file position, llama.cpp by score: the same order for Gemma's normal tokens
(scores fall strictly with the id), so this module follows the scores. Tokens of equal score (Gemma: the 6,414 control and user-defined tokens and one normal token at
-1000, the 256 byte tokens and ``▁t`` at 0) are ranked by id here, by position in the text in llama.cpp; in
Gemma's vocabulary no two such tokens can compete in a merge (the user-defined ones are cut out first, no
control or byte token is the concatenation of two tokens), so that difference cannot show with this file.

The SentencePiece meaning makes ``▁`` (U+2581) in the text a space: it decodes as " " (llama.cpp does the same).
With ``add_space_prefix`` the leading space is dropped from the first token when decoding (llama.cpp's
``remove_space``), but a piece after a user-defined token keeps its added space, so such text does not round
trip; Gemma's files set it false. A vocabulary without all 256 byte tokens is refused: llama.cpp throws on text
that needs a missing one, and no cheaper check tells which text that is.
"""

from __future__ import annotations

import numpy as np

from tformer.core.errors import TformerError
from tformer.core.files import described
from tformer.interop.gguf_tokens import (
    CONTROL,
    FIX,
    ROLE_KEYS,
    UNKNOWN,
    USER_DEFINED,
    GGUFTokenizerBase,
    chat_template_of,
    kind_of,
    read_flag,
    read_framing,
    read_special_ids,
    read_token_types,
    read_tokens,
)

SPACE = "\u2581"  # SentencePiece's visible space: what " " becomes before the merges
SPM_DEFAULT_IDS = {"bos": 1, "eos": 2, "unk": 0}


class GGUFSentencePiece(GGUFTokenizerBase):
    """SentencePiece from a GGUF file's metadata, behind tformer's tokenizer calls (see GGUFTokenizerBase).
    ``add_space_prefix``: whether each piece of text gets a leading space before its merges."""

    model = "llama"

    def __init__(self, hf_special, hf_plain, special_ids: dict[str, int], add_bos: bool, add_eos: bool,
                 add_space_prefix: bool, control_ids: frozenset[int], chat_template: str | None = None):
        super().__init__(hf_special, hf_plain, special_ids, add_bos, add_eos, control_ids, chat_template)
        self.add_space_prefix = add_space_prefix

    def describe(self) -> dict:
        return {**super().describe(), "model": self.model, "add_space_prefix": self.add_space_prefix}

    def __repr__(self) -> str:
        return (f"GGUFSentencePiece(vocab_size={self.vocab_size}, add_bos={self.add_bos}, "
                f"add_space_prefix={self.add_space_prefix}, special_ids={self.special_ids})")


def sentencepiece_from_gguf(metadata: dict) -> GGUFSentencePiece:
    """The SentencePiece tokenizer of a GGUF file whose ``tokenizer.ggml.model`` is "llama"; one-line TformerError
    for metadata it cannot build from."""
    tokens = read_tokens(metadata)
    types = read_token_types(metadata, len(tokens))
    scores = _scores(metadata, len(tokens))
    index = _index(tokens, types)
    merges = merges_from_scores(tokens, scores, index)
    # llama.cpp's ids for a SentencePiece vocabulary whose file names none (LLaMA's): a key set to -1 means none
    absent = {r: i for r, i in SPM_DEFAULT_IDS.items()
              if f"tokenizer.ggml.{ROLE_KEYS[r]}" not in metadata and i < len(tokens)}
    special_ids = {**absent, **read_special_ids(metadata, len(tokens))}
    add_bos, add_eos = read_framing(metadata, special_ids, True)  # llama.cpp adds BOS unless the file says not
    prefix = read_flag(metadata, "add_space_prefix", True)  # llama.cpp's default for SentencePiece
    engines = [_build(tokens, types, index, merges, prefix) for _ in range(2)]
    engines[1].encode_special_tokens = True  # control tokens' text is cut like any other text
    control = frozenset(i for i, kind in enumerate(types) if kind in (CONTROL, UNKNOWN))
    return GGUFSentencePiece(engines[0], engines[1], special_ids, add_bos, add_eos, prefix, control,
                             chat_template_of(metadata))


def _scores(metadata: dict, n: int) -> list[float]:
    scores = metadata.get("tokenizer.ggml.scores")
    if scores is None:
        raise TformerError(f"the GGUF metadata has no tokenizer.ggml.scores, which a SentencePiece vocabulary merges "
                           f"by; {FIX}")
    if isinstance(scores, list) and all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores):
        scores = np.asarray(scores, dtype=np.float64)
    if not (isinstance(scores, np.ndarray) and scores.ndim == 1 and scores.dtype.kind in "fiu"):
        raise TformerError(f"GGUF tokenizer.ggml.scores is {kind_of(scores)}, not an array of numbers; {FIX}")
    if len(scores) != n:
        raise TformerError(f"GGUF tokenizer.ggml.scores has {len(scores)} entries but tokenizer.ggml.tokens has {n}; "
                           f"one score per token is needed; {FIX}")
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        raise TformerError(f"GGUF tokenizer.ggml.scores of token {int(bad[0])} is {scores[bad[0]]}, not a finite "
                           f"number; {FIX}")
    return scores.tolist()


def _index(tokens: list[str], types: list[int]) -> dict[str, int]:
    """token -> id, after checking what the engine needs: unique texts, matchable added tokens, every byte."""
    index: dict[str, int] = {}
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if not token and kind in (CONTROL, USER_DEFINED, UNKNOWN):
            raise TformerError(f"GGUF token {i} is an empty {'user-defined' if kind == USER_DEFINED else 'control'} "
                               f"token, which cannot be matched in text; {FIX}")
        first = index.setdefault(token, i)
        if first != i:
            raise TformerError(f"GGUF tokenizer.ggml.tokens holds {described(token)} twice (ids {first} and {i}); "
                               f"each token's text must be unique; {FIX}")
    missing = [b for b in range(256) if f"<0x{b:02X}>" not in index]
    if missing:
        raise TformerError(f"the SentencePiece vocabulary has no byte token <0x{missing[0]:02X}> ({len(missing)} of the "
                           "256 missing), so text with a character outside the vocabulary cannot be encoded; tformer "
                           "reads SentencePiece vocabularies with byte fallback")
    return index


def merges_from_scores(tokens: list[str], scores: list[float], index: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of every token into two tokens, best first: the merge order of llama.cpp's score-driven
    SentencePiece BPE. Ranked by the whole token's score, higher first; equal scores by id (llama.cpp: by
    position in the text), then by the split, left part shorter first (the same token either way)."""
    found = []
    for i, token in enumerate(tokens):
        for cut in range(1, len(token)):
            if token[:cut] in index and token[cut:] in index:
                found.append((-scores[i], i, cut))
    found.sort()
    return [(tokens[i][:cut], tokens[i][cut:]) for _, i, cut in found]


def _build(tokens, types, index, merges, add_space_prefix: bool):
    # deferred: the tokenizer library loads only for the tokenizer that needs it
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as HF

    # No unk token: every byte has a token (checked), so byte fallback never needs one.
    hf = HF(models.BPE(vocab=dict(index), merges=merges, dropout=None, fuse_unk=False, byte_fallback=True))
    # Added tokens split the text first, and the normalizer then runs on each piece between them: a space prefix
    # goes in front of every piece, as llama.cpp's is_prev_special does.
    escape = normalizers.Replace(" ", SPACE)
    hf.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if add_space_prefix else escape
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    hf.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    special = [AddedToken(tokens[i], normalized=False, special=True)
               for i, kind in enumerate(types) if kind in (CONTROL, UNKNOWN)]
    user = [AddedToken(tokens[i], normalized=False, special=False) for i, kind in enumerate(types) if kind == USER_DEFINED]
    if special:
        hf.add_special_tokens(special)
    if user:
        hf.add_tokens(user)
    return hf


__all__ = ["SPM_DEFAULT_IDS", "GGUFSentencePiece", "merges_from_scores", "sentencepiece_from_gguf"]
