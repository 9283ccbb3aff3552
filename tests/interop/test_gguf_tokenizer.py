"""The tokenizer from a GGUF file (tformer.interop.gguf_tokenizer) against transformers' GGUF tokenizer, on the
real SmolLM2-135M-Instruct file: all of Shakespeare, WikiText-2's test split and a sample of hard text.

transformers (``AutoTokenizer.from_pretrained(folder, gguf_file=...)``) ignores ``tokenizer.ggml.pre ==
"smollm"`` and splits with GPT-2's pattern alone, while llama.cpp (and SmolLM2's own tokenizer) first cut every
digit off on its own. So: text without a ``\\p{N}`` character must give transformers' ids exactly; text with
one may differ, and every difference must vanish when ours is built with the "gpt-2" pre-tokenizer (what
transformers builds), and must be what the HF spelling of SmolLM's split (``Digits(individual_digits=True)``
then ``ByteLevel``) gives. The differing lines are counted and printed (``pytest -s``).

The corpora are compared in pieces cut where a line break's whitespace run meets a non-digit character,
just before the run's last character: a pre-token boundary for both splits, so the pieces' ids concatenated
are the whole text's ids (checked on WikiText-2), and a difference is pinned to a few lines.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import regex

from tformer.core.errors import TformerError
from tformer.data.corpora import get_corpus
from tformer.data.gguf_models import smollm2_gguf_path
from tformer.data.tokenizers import GPT2_PATTERN
from tformer.interop.gguf_file import open_gguf
from tformer.interop.gguf_tokenizer import PRE_TOKENIZERS, GGUFTokenizer, tokenizer_from_gguf
from tformer.interop.source import hf_tokenizer

SAMPLES = [
    "Hello, world! It's a test; we'll see — shan't we? I'd've done it.",
    "naïve café résumé façade Ångström ß ſ ﬁ Œuvre",
    "e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o",  # combining marks, Zalgo
    "Emoji: 😀👍🏽🇺🇸 ❤️ 👩‍👩‍👧‍👦 🏳️‍🌈 and ✓✗ ★",
    "中文：你好，世界！这是一个测试。日本語のテキストとカタカナ ー 한국어 텍스트입니다",
    "مرحبا بالعالم، كيف حالك؟ שלום עולם! \u200fRTL mark\u200e",
    "Россия и Україна, Ελληνικά, ქართული, हिन्दी, ไทย, ᚠᚢᚦ",
    "def f(x):\n    if x > 0:\n\treturn {'a': [1, 2.5, None]}\r\n    return x ** 2  # tab\there\r\n",
    '{\n  "name": "tformer",\n  "nested": {"list": [1, 2, 3], "ok": true},\n\t"empty": ""\n}\n',
    "class A:\n\n    def __init__(self):\n        self.x = 0    \n\n\n\n    pass\n",
    "Numbers 1234567.89 and 3.14159, 1,000,000, -42, 0x1F, 1e-10, 2024-01-31 12:30:45",
    "whitespace   runs\t\t\ttabs \n\n\n  new lines   \r\n\r\n trailing   ",
    "   leading spaces and a very long ............ run ------- of ======= punctuation !!!??",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html> `code` $var @user #tag ~/path\\file",
    "zero\u200bwidth no\u00a0break\u2009thin\u3000ideographic",
    "Ⅻ ① ½ ² ¹⁄₄ ١٢٣ ०१२ 𝟘𝟙𝟚 ⓵",  # numbers beyond 0-9: each cut off on its own by smollm
    "two spaces then digits:  12 and a tab\t7 and a newline\n  3",
    "",
    " ",
    "\n",
    "a",
    "<|im_start|> and <|im_end|> as plain text, <|endoftext|>, <repo_name>",
]
CHAT = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"

# onig's (the library's) whitespace, spelled out so Python's regex agrees with it at the cut
_WS = r"\s\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_RUN = regex.compile(rf"(?<![{_WS}])[ \t\r\n]*\n[ \t\r\n]*(?=[^{_WS}\p{{N}}])")
_NUMBER = regex.compile(r"\p{N}")
# Where GPT-2's split alone and smollm's part: two or more whitespace characters before a number character, or a
# number character beyond 0-9 after a space or next to another (its UTF-8 bytes merge with their neighbours').
_BEYOND = r"(?:(?![0-9])\p{N})"
_CAUSE = regex.compile(rf"\s{{2,}}\p{{N}}|\s{_BEYOND}|{_BEYOND}\p{{N}}|\p{{N}}{_BEYOND}")


def segments(text: str) -> list[str]:
    """``text`` cut just before the last character of each line-break whitespace run followed by a non-digit."""
    cuts = [m.end() - 1 for m in _RUN.finditer(text)]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.fixture(scope="module")
def metadata():
    return open_gguf(smollm2_gguf_path()).metadata


@pytest.fixture(scope="module")
def tok(metadata) -> GGUFTokenizer:
    return tokenizer_from_gguf(metadata)


@pytest.fixture(scope="module")
def tok_gpt2(metadata) -> GGUFTokenizer:
    """Ours with GPT-2's split alone: what transformers builds for this file."""
    return tokenizer_from_gguf({**metadata, "tokenizer.ggml.pre": "gpt-2"})


@pytest.fixture(scope="module")
def tok_digits(tok):
    """The HF spelling of SmolLM's split on our vocabulary: Digits(individual_digits=True), then ByteLevel."""
    from tokenizers import Tokenizer, pre_tokenizers

    hf = Tokenizer.from_str(tok.hf.to_str())
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return hf


@pytest.fixture(scope="module")
def ref():
    """transformers' tokenizer for the file, converted from the GGUF vocabulary (offline), loaded once."""
    transformers = pytest.importorskip("transformers")
    path = smollm2_gguf_path()
    start = time.perf_counter()
    out = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    print(f"\ntransformers' GGUF tokenizer loaded in {time.perf_counter() - start:.1f} s")
    return out


def ref_ids(ref, texts: list[str]) -> list[list[int]]:
    return ref(texts, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------
# The real file: what it says, and the pre-tokenizer transformers builds for it


def test_reads_the_file(tok, ref):
    assert tok.pre == "smollm" and tok.vocab_size == 49152 == len(ref)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id, tok.mask_id) == (1, 2, 2, 0, None)
    assert tok.special_ids == {"bos": 1, "eos": 2, "pad": 2, "unk": 0}
    assert tok.add_bos is False and tok.add_eos is False
    assert tok.control_ids == frozenset(range(17))
    assert tok.chat_template.startswith("{% for message in messages %}")
    assert (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id, ref.unk_token_id) == (1, 2, 2, 0)
    assert "smollm" in repr(tok)


def test_transformers_ignores_smollm(ref):
    """What the comparison rests on: transformers builds GPT-2's ByteLevel split alone for this file, no
    digit split, no normalizer, the ByteLevel decoder."""
    import json

    spec = json.loads(ref.backend_tokenizer.to_str())
    assert spec["pre_tokenizer"] == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                     "use_regex": True}
    assert spec["normalizer"] is None and spec["decoder"]["type"] == "ByteLevel"
    assert spec["model"]["type"] == "BPE" and not spec["model"]["ignore_merges"]
    # where that shows: two spaces before a digit
    assert ref("a  1", add_special_tokens=False)["input_ids"] == [81, 216, 216, 33]


def test_smollm_splits_each_digit_as_llama_cpp_does(tok, tok_gpt2):
    assert tok.encode("a  1") == [81, 256, 33]  # "a", "ĠĠ", "1": the run of spaces stays whole
    assert tok_gpt2.encode("a  1") == [81, 216, 216, 33]  # "a", "Ġ", "Ġ" + "1"
    assert tok.encode("1234567.89") == [33, 34, 35, 36, 37, 38, 39, 30, 40, 41]
    for text in SAMPLES + [CHAT]:
        pieces = [p for p, _ in tok.hf.pre_tokenizer.pre_tokenize_str(text)]
        assert pieces == [byte_spelled(p) for p in llama_cpp_pieces(text)], text


def isolated(pattern: str, text: str) -> list[str]:
    """llama.cpp's unicode_regex_split for one pattern: every match and every stretch between matches."""
    out, last = [], 0
    for m in regex.finditer(pattern, text):
        if m.start() > last:
            out.append(text[last:m.start()])
        if m.end() > m.start():
            out.append(m.group())
        last = m.end()
    return out + ([text[last:]] if last < len(text) else [])


def llama_cpp_pieces(text: str) -> list[str]:
    """The smollm split written out with Python's regex: \\p{N} on its own, then GPT-2's pattern."""
    return [q for p in isolated(r"\p{N}", text) for q in isolated(GPT2_PATTERN, p)]


def byte_spelled(piece: str) -> str:
    from tformer.interop.gguf_tokenizer import BYTES

    return "".join(BYTES[b] for b in piece.encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# Token-for-token against transformers: the corpora and the sample


def compare(name: str, text: str, tok, tok_gpt2, tok_digits, ref, chunks: int = 1024) -> dict:
    """Ids of ``text`` from ours and from transformers, in ``chunks`` batches of whole segments; differing
    chunks are compared segment by segment. Round trip checked on every chunk."""
    segs = segments(text)
    assert "".join(segs) == text
    step = -(-len(segs) // chunks)
    spans = [(a, min(a + step, len(segs))) for a in range(0, len(segs), step)]
    pieces = ["".join(segs[a:b]) for a, b in spans]
    start = time.perf_counter()
    ours = tok.encode_batch(pieces)
    took = time.perf_counter() - start
    theirs = ref_ids(ref, pieces)
    bad_segments = bad_lines = bad_tokens = places = 0
    examples = []
    for (a, b), piece, mine, their in zip(spans, pieces, ours, theirs):
        assert tok.decode(mine) == piece  # round trip
        if mine == their:
            continue
        part = segs[a:b]
        for seg, m, t, g, d in zip(part, tok.encode_batch(part), ref_ids(ref, part), tok_gpt2.encode_batch(part),
                                   tok_digits.encode_batch_fast(part, add_special_tokens=False)):
            if m == t:
                continue
            assert _NUMBER.search(seg), f"{name}: a segment without digits differs: {seg[:200]!r}"
            cause = _CAUSE.findall(seg)
            assert cause, f"{name}: a difference with no known cause in {seg[:200]!r}"
            places += len(cause)
            assert g == t, f"{name}: ours with GPT-2's split differs from transformers on {seg[:200]!r}"
            assert d.ids == m, f"{name}: Digits+ByteLevel differs from smollm on {seg[:200]!r}"
            bad_segments += 1
            bad_lines += seg.count("\n") or 1
            bad_tokens += max(len(m), len(t))
            if len(examples) < 3:
                examples.append(seg[:60])
    stats = {"corpus": name, "characters": len(text), "lines": text.count("\n"), "segments": len(segs),
             "tokens": sum(map(len, ours)), "transformers_tokens": sum(map(len, theirs)),
             "differing_segments": bad_segments, "lines_in_them": bad_lines, "causes_in_them": places,
             "tokens_in_differing_segments": bad_tokens, "encode_s": round(took, 2)}
    print(f"\n{stats}\n  differing, e.g.: {examples}")
    return stats


def test_shakespeare_equals_transformers(tok, tok_gpt2, tok_digits, ref):
    corpus = get_corpus("shakespeare")
    text = corpus.text("train") + corpus.text("validation")
    stats = compare("shakespeare", text, tok, tok_gpt2, tok_digits, ref)
    assert stats["tokens"] > 1_500_000 and stats["differing_segments"] < 0.01 * stats["segments"]


def test_wikitext2_equals_transformers(tok, tok_gpt2, tok_digits, ref):
    text = get_corpus("wikitext2").text("test")
    stats = compare("wikitext2-test", text, tok, tok_gpt2, tok_digits, ref)
    assert stats["tokens"] > 290_000
    # the pieces' ids concatenated are the whole text's ids
    whole = tok.encode(text)
    assert whole == [i for seg in tok.encode_batch(segments(text)) for i in seg]
    assert tok.decode(whole) == text


def test_samples_equal_transformers(tok, tok_gpt2, tok_digits, ref):
    # transformers always matches control tokens in the text: compared with special=True
    ours, theirs = tok.encode_batch(SAMPLES, special=True), ref_ids(ref, SAMPLES)
    gpt2 = tok_gpt2.encode_batch(SAMPLES, special=True)
    differing = []
    for text, m, t, g, plain in zip(SAMPLES, ours, theirs, gpt2, tok.encode_batch(SAMPLES)):
        assert tok.encode(text, special=True) == m and tok.encode(text) == plain
        assert tok.decode(m) == text == tok.decode(plain)  # round trips
        assert ref.decode(m) == text  # and decodes as transformers does
        assert g == t, text
        if _NUMBER.search(text):
            assert tok_digits.encode(text, add_special_tokens=False).ids == m, text
        else:
            assert m == t, text
        if m != t:
            differing.append(text[:40])
    print(f"\nsample: {len(SAMPLES)} texts, {sum(map(len, ours))} tokens, {len(differing)} differ (digits): "
          f"{differing}")
    assert "two spaces then digits:  12 and a tab" in {d[:37] for d in differing}


def test_add_special_tokens_as_transformers(tok, ref):
    for text in ("Hello", CHAT):
        assert tok.encode(text, add_special_tokens=True) == tok.encode(text)  # add_bos is false in this file
        assert tok.encode(text, add_special_tokens=True, special=True) == ref(text)["input_ids"]


# ---------------------------------------------------------------------------------------------
# Special tokens


def test_control_tokens_whole_only_when_asked(tok, ref):
    assert tok.encode("<|im_start|>", special=True) == [1]
    assert tok.encode("<|im_end|>", special=True) == [2]
    for name in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<jupyter_code>"):
        plain = tok.encode(name)
        assert len(plain) > 1 and not set(plain) & tok.control_ids
        assert tok.decode(plain) == name
    chat = tok.encode(CHAT, special=True)
    assert chat == ref_ids(ref, [CHAT])[0]  # transformers always matches them
    assert chat[:1] == [1] and chat.count(1) == 3 and chat.count(2) == 2
    assert tok.decode(chat) == CHAT
    assert tok.decode(chat, skip_special=True) == CHAT.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert tok.decode([1, 2, 0]) == "<|im_start|><|im_end|><|endoftext|>"
    assert tok.decode([1, 2, 0], skip_special=True) == ""
    assert tok.encode_batch([CHAT, "<|im_end|>"], special=True) == [chat, [2]]
    assert not set(tok.encode(CHAT)) & tok.control_ids


def test_decode_refuses_ids_outside_the_vocabulary(tok):
    for ids in ([49152], [5, -1], [10**12]):
        with pytest.raises(TformerError, match="out of range") as err:
            tok.decode(ids)
        assert "\n" not in str(err.value)
    assert tok.decode(np.array([28120, 905])) == tok.decode([28120, 905])


def test_bytes_without_a_token_are_refused(tok):
    """SmolLM2's vocabulary has no token for bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xf1, 0xf2 (and those UTF-8
    never uses): transformers drops such a character silently, llama.cpp throws; this is one line."""
    for text, code in (("ab\x04c", "U+0004"), ("é\U00050000", "U+50000"), ("x\x1d", "U+001D")):
        with pytest.raises(TformerError, match=regex.escape(code)) as err:
            tok.encode(text)
        assert "\n" not in str(err.value)
        with pytest.raises(TformerError, match=regex.escape(code)):
            tok.encode_batch(["fine", text])
    assert tok.encode_batch(["a\x00b", "\x7f"]) == [tok.encode("a\x00b"), tok.encode("\x7f")]
    for bad in ("ok \ud800 no", b"bytes"):
        with pytest.raises(TformerError, match="surrogate U\\+D800 at position 3|encodes text") as err:
            tok.encode(bad)
        assert "\n" not in str(err.value)
        with pytest.raises(TformerError, match="surrogate U\\+D800 at position 3|encodes text"):
            tok.encode_batch(["fine", bad])


def test_save_reads_back(tok, tmp_path):
    path = tok.save(tmp_path / "tok")
    assert path.name == "tokenizer.json"
    back = hf_tokenizer(path.parent)
    for text in SAMPLES + [CHAT]:
        assert back.encode(text) == tok.encode(text, special=True)
        assert back.decode(tok.encode(text)) == text


# ---------------------------------------------------------------------------------------------
# Synthetic metadata: the other pre-tokenizers, framing, and every refusal in one line


def small(**changes) -> dict:
    """A small byte-level vocabulary: two control tokens, a user-defined one, every byte, and a few merges."""
    from tformer.interop.gguf_tokenizer import BYTES

    tokens = ["<s>", "</s>", "<think>", *BYTES.values(), "Ġa", "Ġab", "12", "123"]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([3, 3, 4] + [1] * (len(tokens) - 3), dtype=np.int32),
        "tokenizer.ggml.merges": ["Ġ a", "Ġa b", "1 2", "12 3"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }
    meta.update(changes)
    return {k: v for k, v in meta.items() if v is not None}


def test_small_vocabulary_and_framing(tmp_path):
    tok = tokenizer_from_gguf(small())
    ab, think = tok.hf.token_to_id("Ġab"), 2
    assert tok.vocab_size == 263 and tok.add_bos is False
    assert tok.encode("x ab") == [tok.hf.token_to_id("x"), ab]
    assert tok.encode("<think>a") == [think, tok.hf.token_to_id("a")]  # user-defined: always whole
    assert tok.decode([think], skip_special=True) == "<think>"  # and not skipped
    assert tok.encode("<s>")[0] != 0 and tok.encode("<s>", special=True) == [0]
    framed = tokenizer_from_gguf(small(**{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}))
    assert framed.encode(" ab", add_special_tokens=True) == [0, ab, 1]
    assert framed.encode_batch([" ab"], add_special_tokens=True) == [[0, ab, 1]]
    assert hf_tokenizer(framed.save(tmp_path).parent).encode(" ab", add_special_tokens=True) == [0, ab, 1]


def test_other_pre_tokenizers():
    ids = {pre: tokenizer_from_gguf(small(**{"tokenizer.ggml.pre": pre})).encode("x 123") for pre in PRE_TOKENIZERS}
    one, three = (tokenizer_from_gguf(small()).hf.token_to_id(t) for t in ("1", "123"))
    assert ids["gpt-2"][-1] == three and ids["gpt2"] == ids["gpt-2"]
    assert ids["smollm"][-3:] == [one, one + 1, one + 2]
    assert ids["llama-bpe"][-1] == three and ids["default"][-1] == three
    llama3 = tokenizer_from_gguf(small(**{"tokenizer.ggml.pre": "llama-bpe"}))
    assert llama3.add_bos and llama3.encode("a", add_special_tokens=True)[0] == 0  # llama.cpp's default for llama3
    assert tokenizer_from_gguf(small(**{"tokenizer.ggml.pre": None})).pre == "default"  # as llama.cpp


@pytest.mark.parametrize("changes, fragments", [
    ({"tokenizer.ggml.pre": "deepseek-llm"}, ['"deepseek-llm"', "smollm", "gpt-2", "llama-bpe", "qwen2", "default"]),
    ({"tokenizer.ggml.merges": None}, ["no tokenizer.ggml.merges"]),
    ({"tokenizer.ggml.token_type": np.ones(5, np.int32)}, ["token_type has 5 entries", "tokens has 263"]),
    ({"tokenizer.ggml.merges": ["Ġ a", "Ġa zz"]}, ["merge 1", '"zz"', "not in tokenizer.ggml.tokens"]),
    ({"tokenizer.ggml.merges": ["Ġa a"]}, ["merge 0", 'makes "Ġaa"']),
    ({"tokenizer.ggml.merges": ["Ġa"]}, ["merge 0", "not two tokens"]),
    ({"tokenizer.ggml.tokens": "abc"}, ["tokenizer.ggml.tokens is", "not an array of strings"]),
    ({"tokenizer.ggml.tokens": np.arange(3)}, ["tokenizer.ggml.tokens is", "not an array of strings"]),
    ({"tokenizer.ggml.tokens": ["a", 1]}, ["tokenizer.ggml.tokens is", "not an array of strings"]),
    ({"tokenizer.ggml.tokens": []}, ["tokenizer.ggml.tokens is empty"]),
    ({"tokenizer.ggml.tokens": None}, ["no tokenizer.ggml.tokens"]),
    ({"tokenizer.ggml.model": "llama"}, ["no tokenizer.ggml.scores", "SentencePiece"]),  # built by gguf_spm
    ({"tokenizer.ggml.model": "bert"}, ['"bert"', '"gpt2"']),
    ({"tokenizer.ggml.model": None}, ["no tokenizer.ggml.model"]),
    ({"tokenizer.ggml.token_type": np.array([9] * 263)}, ["token 0 is 9"]),
    ({"tokenizer.ggml.token_type": "x"}, ["token_type is", "not an array of integers"]),
    ({"tokenizer.ggml.bos_token_id": 999}, ["bos_token_id is 999", "263 tokens"]),
    ({"tokenizer.ggml.eos_token_id": "2"}, ["eos_token_id is", "not a token id"]),
    ({"tokenizer.ggml.add_bos_token": 1}, ["add_bos_token is 1", "not a boolean"]),
    ({"tokenizer.ggml.add_eos_token": True, "tokenizer.ggml.eos_token_id": None}, ["add_eos_token", "no tokenizer"]),
])
def test_bad_metadata_is_one_line(changes, fragments):
    with pytest.raises(TformerError) as err:
        tokenizer_from_gguf(small(**changes))
    message = str(err.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_duplicate_tokens_are_refused():
    meta = small()
    meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"][:-1], "Ġa"]
    with pytest.raises(TformerError, match=r'"Ġa" twice \(ids 259 and 262\)'):
        tokenizer_from_gguf(meta)
