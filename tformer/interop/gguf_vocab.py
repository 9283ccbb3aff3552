"""The tokenizer a GGUF file carries, as save_gguf writes it (see tformer.interop.gguf_write): a byte-level BPE
vocabulary (tokens in GPT-2's byte alphabet, merges, token types, special ids) from whichever tokenizer the
model has, or a GGUF file's own tokenizer metadata carried as read."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from tformer.core.errors import TformerError
from tformer.interop.gguf_tokenizer import BYTES

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
# A tokenizer's role -> its id key; llama.cpp spells the separator "seperator".
ROLE_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id",
             "sep": "seperator_token_id", "cls": "cls_token_id", "mask": "mask_token_id"}
# llama.cpp's end-of-text token for a gpt2 vocabulary whose file names none.
_DEFAULT_EOS = 11


@dataclass
class _Entry:
    key: str
    value: object
    type: str  # a GGUF value type as GGUFFile.metadata_types spells it: u32, f32, bool, string, array[string] ...




BYTE_ALPHABET = [BYTES[b] for b in range(256)]  # GPT-2's byte -> character table, as the GGUF tokenizer reads it


def byte_level(data: bytes) -> str:
    return "".join(BYTE_ALPHABET[b] for b in data)


@dataclass
class _Vocabulary:
    """A byte-level BPE vocabulary to write: tokens by id, their types, merges, ids by role."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    special_ids: dict[str, int]
    pre: str
    add_bos: bool = False
    add_eos: bool | None = None  # None: not written (llama.cpp's default, false)
    chat_template: str | None = None
    source: str = ""  # the tokenizer, in words


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list that tiktoken's ranks stand for, in rank order.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank; a merge list merges the listed pair
    that comes first. The pair that forms token T is what byte-pair merging T's own bytes with every rank below
    T's leaves: two parts, whose ranks order the merges the same way as T's rank."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) != 2 or parts[0] not in ranks or parts[1] not in ranks:
            raise TformerError(f"the tiktoken ranks give token {token!r} (rank {rank}) no pair of lower-ranked "
                               "tokens it is merged from; they are not a byte-pair encoding a merge list can hold")
        merges.append((parts[0], parts[1]))
    return merges


def _from_tiktoken(tok) -> _Vocabulary:
    from tformer.data.tokenizers import GPT2_EOT, GPT2_EOT_ID, GPT2_RANKS_SHA256_PREFIX, load_tiktoken_ranks

    ranks = load_tiktoken_ranks(tok.ranks_path, GPT2_RANKS_SHA256_PREFIX)
    n = tok.vocab_size
    tokens: list[str | None] = [None] * n
    for token, rank in ranks.items():
        tokens[rank] = byte_level(token)
    tokens[GPT2_EOT_ID] = GPT2_EOT
    types = [NORMAL] * n
    types[GPT2_EOT_ID] = CONTROL
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise TformerError(f"the GPT-2 ranks leave token id {missing[0]} without a token; fetch them again")
    merges = [f"{byte_level(a)} {byte_level(b)}" for a, b in merges_from_ranks(ranks)]
    return _Vocabulary(tokens, types, merges, dict(tok.special_ids), "gpt-2", source="GPT-2's BPE (tiktoken ranks)")


def _from_chars(tok) -> _Vocabulary:
    wide = next((c for c in tok.chars if ord(c) > 0x7F), None)
    if wide is not None:
        raise TformerError(f"the character tokenizer holds {wide!r} (U+{ord(wide):04X}), which is more than one byte "
                           "in UTF-8; llama.cpp's byte-level vocabulary can stand for a character tokenizer only when "
                           "every character is ASCII: train with a bpe or gpt2 tokenizer to export this one")
    tokens = list(tok.specials.values()) + [byte_level(c.encode("ascii")) for c in tok.chars]
    types = [CONTROL] * len(tok.specials) + [NORMAL] * len(tok.chars)
    return _Vocabulary(tokens, types, [], dict(tok.special_ids), "gpt-2",
                       source="characters as single-byte tokens")


def _hf_json(hf) -> dict:
    return json.loads(hf.to_str())


def _from_hf(hf, special_ids: dict[str, int], what: str) -> _Vocabulary:
    """A byte-level BPE tokenizer.json with GPT-2's pre-tokenizer (what ByteBPETokenizer trains)."""
    d = _hf_json(hf)
    model, pre, norm, dec = d.get("model") or {}, d.get("pre_tokenizer") or {}, d.get("normalizer"), d.get("decoder")
    problems = []
    if model.get("type") != "BPE":
        problems.append(f"its model is {model.get('type')}, not BPE")
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or not pre.get("use_regex", True):
        problems.append("its pre-tokenizer is not GPT-2's byte-level split (ByteLevel, use_regex, no prefix space)")
    if norm is not None:
        problems.append(f"it has a normalizer ({norm.get('type')}), which llama.cpp does not apply")
    if (dec or {}).get("type") != "ByteLevel":
        problems.append("its decoder is not ByteLevel")
    if model.get("byte_fallback") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") \
            or model.get("ignore_merges"):
        problems.append("its BPE model has options (byte_fallback, subword prefix or suffix, ignore_merges) "
                        "llama.cpp's gpt-2 vocabulary lacks")
    if problems:
        raise TformerError(f"{what} cannot be written as llama.cpp's byte-level BPE vocabulary: {'; '.join(problems)}")
    vocab = hf.get_vocab(with_added_tokens=True)
    n = max(vocab.values()) + 1 if vocab else 0
    tokens: list[str | None] = [None] * n
    for token, i in vocab.items():
        tokens[i] = token
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise TformerError(f"{what} has no token with id {missing[0]}; llama.cpp's vocabulary numbers tokens 0..n-1")
    types = [NORMAL] * n
    for added in d.get("added_tokens") or []:
        types[added["id"]] = CONTROL if added.get("special") else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return _Vocabulary(tokens, types, merges, special_ids, "gpt-2", source=what)


def _from_gguf_tokenizer(tok) -> _Vocabulary:
    """Rebuilt from a GGUFTokenizer that does not carry its file's metadata (see keep_gguf_metadata)."""
    vocab = tok.hf.get_vocab(with_added_tokens=True)
    tokens: list[str | None] = [None] * (max(vocab.values()) + 1)
    for token, i in vocab.items():
        tokens[i] = token
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise TformerError(f"the GGUF tokenizer has no token with id {missing[0]}")
    added = {a["id"]: a for a in _hf_json(tok.hf).get("added_tokens") or []}
    types = [CONTROL if i in tok.control_ids else USER_DEFINED if i in added else NORMAL for i in range(len(tokens))]
    model = _hf_json(tok.hf).get("model") or {}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    return _Vocabulary(tokens, types, merges, dict(tok.special_ids), tok.pre, add_bos=tok.add_bos,
                       add_eos=tok.add_eos or None, chat_template=tok.chat_template,
                       source=f"the GGUF file's tokenizer (rebuilt; pre-tokenizer {tok.pre})")


def _vocabulary(tokenizer, config) -> _Vocabulary:
    from tformer.data.tokenizers import CharTokenizer, GPT2Tokenizer, HFTokenizer, WordPieceTokenizer
    from tformer.interop.gguf_tokenizer import GGUFTokenizer

    config_ids = {r: getattr(config, f"{r}_token_id") for r in ("bos", "eos", "pad")
                  if getattr(config, f"{r}_token_id") is not None}
    if isinstance(tokenizer, GGUFTokenizer):
        return _from_gguf_tokenizer(tokenizer)
    if isinstance(tokenizer, GPT2Tokenizer):
        return _from_tiktoken(tokenizer)
    if isinstance(tokenizer, CharTokenizer):
        return _from_chars(tokenizer)
    if isinstance(tokenizer, WordPieceTokenizer):
        raise TformerError("a WordPiece tokenizer (BERT's) has no llama.cpp byte-level BPE form; "
                           "tformer writes GGUF vocabularies from gpt2, bpe and character tokenizers")
    if isinstance(tokenizer, HFTokenizer):
        what = "tformer's byte-level BPE tokenizer" if tokenizer.kind == "bpe" else f"the {tokenizer.kind} tokenizer"
        return _from_hf(tokenizer.hf, dict(tokenizer.special_ids), what)
    # interop.source.HFTokenizerAdapter: a Hugging Face folder's tokenizer.json
    engine = getattr(tokenizer, "tok", None)
    if engine is not None and hasattr(engine, "to_str"):
        return _from_hf(engine, config_ids, "the folder's tokenizer.json")
    raise TformerError(f"a {type(tokenizer).__name__} has no GGUF vocabulary form; tformer writes GGUF vocabularies "
                       "from gpt2, bpe and character tokenizers and from GGUF files")


def _tokenizer_entries(vocab: _Vocabulary, n_rows: int) -> tuple[list[_Entry], list[str]]:
    tokens, types, notes = list(vocab.tokens), list(vocab.types), []
    if len(tokens) > n_rows:
        raise TformerError(f"the tokenizer has {len(tokens):,} tokens but the model's embedding only {n_rows:,} rows; "
                           "llama.cpp needs one row per token")
    if len(tokens) < n_rows:
        taken = set(tokens)
        pads = [f"[PAD{i}]" for i in range(len(tokens), n_rows)]
        clash = next((p for p in pads if p in taken), None)
        if clash is not None:
            raise TformerError(f"the vocabulary already holds {clash}, the name of a padding token; rename it")
        notes.append(f"the embedding has {n_rows - len(tokens):,} rows past the tokenizer's {len(tokens):,} tokens; "
                     "they are written as unused tokens [PAD<id>]")
        tokens += pads
        types += [UNUSED] * len(pads)
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if seen.setdefault(t, i) != i:
            raise TformerError(f"the vocabulary holds {t!r} twice (ids {seen[t]} and {i}); llama.cpp needs every "
                               "token's text unique")
    ids = {}
    for role, i in vocab.special_ids.items():
        if role in ROLE_KEYS and i is not None:
            if not 0 <= int(i) < n_rows:
                raise TformerError(f"the tokenizer's {role} token id {i} is outside the vocabulary of {n_rows:,}")
            ids[role] = int(i)
    if "eos" not in ids and len(tokens) > _DEFAULT_EOS:
        shown = tokens[_DEFAULT_EOS]
        notes.append(f"the tokenizer has no end-of-text token; llama.cpp then takes token {_DEFAULT_EOS} "
                     f"({shown!r}) as one, so its generation stops there (train with a tokenizer that has one "
                     "to avoid this)")
    out = [_Entry("tokenizer.ggml.model", "gpt2", "string"), _Entry("tokenizer.ggml.pre", vocab.pre, "string"),
           _Entry("tokenizer.ggml.tokens", tokens, "array[string]"),
           _Entry("tokenizer.ggml.token_type", types, "array[i32]"),
           _Entry("tokenizer.ggml.merges", list(vocab.merges), "array[string]")]
    out += [_Entry(f"tokenizer.ggml.{ROLE_KEYS[role]}", ids[role], "u32") for role in ROLE_KEYS if role in ids]
    out.append(_Entry("tokenizer.ggml.add_bos_token", bool(vocab.add_bos), "bool"))
    if vocab.add_eos is not None:
        out.append(_Entry("tokenizer.ggml.add_eos_token", bool(vocab.add_eos), "bool"))
    if vocab.chat_template:
        out.append(_Entry("tokenizer.chat_template", vocab.chat_template, "string"))
    return out, notes


# The types of the tokenizer keys llama.cpp reads, for metadata carried without its file's types.
_KNOWN_TYPES = {"tokenizer.ggml.model": "string", "tokenizer.ggml.pre": "string", "tokenizer.chat_template": "string",
                "tokenizer.ggml.tokens": "array[string]", "tokenizer.ggml.merges": "array[string]",
                "tokenizer.ggml.token_type": "array[i32]", "tokenizer.ggml.scores": "array[f32]"}


def _guess_type(key: str, value) -> str | None:
    if key in _KNOWN_TYPES:
        return _KNOWN_TYPES[key]
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if key.endswith("_token_id"):
        return "u32"
    if isinstance(value, (int, np.integer)):
        return "u32" if value >= 0 else "i32"
    if isinstance(value, (float, np.floating)):
        return "f32"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "array[string]"
    return None


def gguf_tokenizer_metadata(path) -> dict[str, tuple[object, str]]:
    """A GGUF file's ``tokenizer.*`` metadata: key -> (value, its GGUF type name), in file order."""
    from tformer.interop.gguf_file import open_gguf

    with open_gguf(path) as f:
        return {k: (v, f.metadata_types.get(k)) for k, v in f.metadata.items() if k.startswith("tokenizer.")}


def keep_gguf_metadata(tokenizer, path) -> None:
    """Let ``tokenizer`` (read from the GGUF file ``path``) carry that file's ``tokenizer.*`` metadata, so that
    save_gguf writes it back exactly as read (``metadata`` and ``metadata_types``, unless it has them already)."""
    if getattr(tokenizer, "metadata", None) is not None:
        return
    found = gguf_tokenizer_metadata(path)
    tokenizer.metadata = {k: v for k, (v, _) in found.items()}
    tokenizer.metadata_types = {k: t for k, (_, t) in found.items()}


def _carried_entries(tokenizer, n_rows: int) -> list[_Entry] | None:
    """The tokenizer.* metadata a GGUF tokenizer carries from its file, typed as there; None when it carries none."""
    metadata = getattr(tokenizer, "metadata", None)
    if not isinstance(metadata, dict):
        return None
    types = getattr(tokenizer, "metadata_types", None) or {}
    out = []
    for key, value in metadata.items():
        if not key.startswith("tokenizer."):
            continue
        kind = types.get(key) or _guess_type(key, value)
        if kind is None or kind.count("array") > 1:
            raise TformerError(f"the GGUF tokenizer's metadata {key} has no GGUF type tformer writes")
        out.append(_Entry(key, value, kind))
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None or len(tokens) != n_rows:
        count = "none" if tokens is None else f"{len(tokens):,}"
        raise TformerError(f"the GGUF tokenizer's metadata has {count} tokens but the model's embedding {n_rows:,} "
                           "rows; llama.cpp needs one token per row")
    return out


# ---------------------------------------------------------------------------------------------
# Writing


__all__ = ["BYTE_ALPHABET", "ROLE_KEYS", "byte_level", "gguf_tokenizer_metadata", "keep_gguf_metadata",
           "merges_from_ranks"]
