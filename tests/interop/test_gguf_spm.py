"""The SentencePiece tokenizer from a GGUF file (tformer.interop.gguf_spm) against transformers' GGUF tokenizer and
against llama.cpp's algorithm written out in Python, on the real Gemma 3 270M file: all of Shakespeare,
WikiText-2's test split and a sample of hard text.

transformers (``AutoTokenizer.from_pretrained(folder, gguf_file=...)``) respells the file's user-defined tokens of
2-31 spaces as ``▁▁``... and leaves them to BPE merges ranked by file position; llama.cpp cuts them out of the raw
text whole, longest first, and merges the rest by score. So: text without a run of more than 31 spaces must give
transformers' ids exactly; a text with one may differ, and every difference must be llama.cpp's ids (the
written-out algorithm, ``LlamaCppSPM``) on our side, and must vanish when ours is built from transformers' reading
of the file (spaces respelled and left to the merges, scores replaced by file position). The differing lines are
counted and printed (``pytest -s``).

The corpora are compared in pieces cut after each run of line breaks: ``\\n`` runs are user-defined tokens, cut out
of the text first and whole, so the pieces' ids concatenated are the whole text's ids (checked on WikiText-2).
"""

from __future__ import annotations

import heapq
import json
import time

import numpy as np
import pytest
import regex

from tformer.core.errors import TformerError
from tformer.data.corpora import get_corpus
from tformer.interop.gguf_file import open_gguf
from tformer.interop.gguf_spm import GGUFSentencePiece
from tformer.interop.gguf_tokenizer import tokenizer_from_gguf
from tformer.interop.source import hf_tokenizer

SAMPLES = [
    "Hello, world! It's a test; we'll see — shan't we? I'd've done it.",
    "naïve café résumé façade Ångström ß ſ ﬁ Œuvre",
    "e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o",  # combining marks, Zalgo
    "Emoji: 😀👍🏽🇺🇸 ❤️ 👩‍👩‍👧‍👦 🏳️‍🌈 and ✓✗ ★ 🫠🪿",
    "中文：你好，世界！这是一个测试。日本語のテキストとカタカナ ー 한국어 텍스트입니다",
    "مرحبا بالعالم، كيف حالك؟ שלום עולם! \u200fRTL mark\u200e",
    "Россия и Україна, Ελληνικά, ქართული, हिन्दी, ไทย, ᚠᚢᚦ, 𓀀𓀁 (no token: bytes)",
    "def f(x):\n    if x > 0:\n\treturn {'a': [1, 2.5, None]}\r\n    return x ** 2  # tab\there\r\n",
    '{\n  "name": "tformer",\n  "nested": {"list": [1, 2, 3], "ok": true},\n\t"empty": ""\n}\n',
    "class A:\n\n    def __init__(self):\n        self.x = 0    \n\n\n\n    pass\n",
    "Numbers 1234567.89 and 3.14159, 1,000,000, -42, 0x1F, 1e-10, 2024-01-31 12:30:45 Ⅻ ½ ²",
    "whitespace   runs\t\t\ttabs \n\n\n  new lines   \r\n\r\n trailing   ",
    "   leading spaces and a very long ............ run ------- of ======= punctuation !!!??",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html> `code` $var @user #tag ~/path\\file",
    "<table><tr><td>1</td></tr></table> <h1>T</h1><b>bold</b><i>it</i> [multimodal] <start_of_image>",
    "zero\u200bwidth no\u00a0break\u2009thin\u3000ideographic",
    "a" + " " * 31 + "b" + " " * 30 + "c" + "\n" * 31 + "d" + "\t" * 31 + "e",  # the longest runs, one token each
    "a" + " " * 32 + "b " + " " * 40 + "c" + " " * 63 + "\n",  # longer runs: where transformers differs
    "\n" * 40 + "\t" * 45 + "x" + "\n \n  \n",
    "control text: <bos> <eos> <pad> <unk> <mask> <start_of_turn> <end_of_turn> <unused0> <0x41> <0xZZ>",
    "NUL \x00, DEL \x7f, bell \x07, escape \x1b[0m, form feed \x0c, CR alone \r, U+FFFD \ufffd, BOM \ufeff",
    "",
    " ",
    "\n",
    "a",
    "▁",
]
CHAT = "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
_LONG_SPACES = regex.compile(" {32,}")


def segments(text: str) -> list[str]:
    """``text`` cut after each run of line breaks."""
    cuts = [m.end() for m in regex.finditer(r"\n+(?=[^\n])", text)]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


class LlamaCppSPM:
    """llama.cpp's SentencePiece tokenization written out in Python from ``src/llama-vocab.cpp`` (slow; the oracle):
    ``tokenizer_st_partition`` (user-defined tokens, and control / unknown ones when ``special``, cut out of the
    raw text, longest first by bytes), then per piece ``llm_tokenizer_spm_session`` (spaces escaped, the adjacent
    pair that makes the highest-scoring token merged first, the leftmost on a tie, byte fallback)."""

    def __init__(self, metadata: dict):
        tokens = metadata["tokenizer.ggml.tokens"]
        types = np.asarray(metadata["tokenizer.ggml.token_type"]).tolist()
        self.scores = np.asarray(metadata["tokenizer.ggml.scores"], dtype=np.float64).tolist()
        self.index = {t: i for i, t in enumerate(tokens)}
        self.cut_out = sorted(((t, i, kind) for i, (t, kind) in enumerate(zip(tokens, types)) if kind in (2, 3, 4)),
                              key=lambda x: -len(x[0].encode("utf-8")))
        self.prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))

    def encode(self, text: str, special: bool = False) -> list[int]:
        fragments: list[str | int] = [text] if text else []
        for token, i, kind in self.cut_out:
            if kind != 4 and not special:
                continue
            out = []
            for fragment in fragments:
                if isinstance(fragment, int):
                    out.append(fragment)
                    continue
                for j, piece in enumerate(fragment.split(token)):
                    out += ([i] if j else []) + ([piece] if piece else [])
            fragments = out
        ids = []
        for fragment in fragments:
            if isinstance(fragment, int):
                ids.append(fragment)
            else:
                ids += self._merge((" " + fragment if self.prefix else fragment).replace(" ", "\u2581"))
        return ids

    def _merge(self, text: str) -> list[int]:
        n = len(text)
        size, prev, nxt = [1] * n, list(range(-1, n - 1)), [*range(1, n), -1]
        queue = []

        def add(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                found = self.index.get(text[left:left + size[left] + size[right]])
                if found is not None:
                    heapq.heappush(queue, (-self.scores[found], left, right, size[left] + size[right]))

        for i in range(1, n):
            add(i - 1, i)
        while queue:
            _, left, right, both = heapq.heappop(queue)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != both:
                continue  # one side merged since
            size[left], size[right] = both, 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        ids, i = [], 0 if n else -1
        while i != -1:
            symbol = text[i:i + size[i]]
            found = self.index.get(symbol)
            ids += [found] if found is not None else [self.index[f"<0x{b:02X}>"] for b in symbol.encode("utf-8")]
            i = nxt[i]
        return ids


@pytest.fixture(scope="module")
def metadata(gemma3_path):
    return open_gguf(gemma3_path).metadata


@pytest.fixture(scope="module")
def tok(metadata) -> GGUFSentencePiece:
    start = time.perf_counter()
    out = tokenizer_from_gguf(metadata)
    print(f"\ntokenizer_from_gguf (262,144 tokens) in {time.perf_counter() - start:.1f} s")
    return out


@pytest.fixture(scope="module")
def tok_hf_reading(metadata) -> GGUFSentencePiece:
    """Ours built from transformers' reading of the file: the space-run tokens respelled ``▁▁``... and left to the
    merges (normal tokens), every token's score its file position."""
    tokens = [("\u2581" * len(t) if t.strip(" ") == "" and len(t) > 1 else t) for t in metadata["tokenizer.ggml.tokens"]]
    types = np.asarray(metadata["tokenizer.ggml.token_type"]).copy()
    types[[i for i, t in enumerate(metadata["tokenizer.ggml.tokens"]) if t != tokens[i]]] = 1
    return tokenizer_from_gguf({**metadata, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                                "tokenizer.ggml.scores": -np.arange(len(tokens), dtype=np.float32)})


@pytest.fixture(scope="module")
def llama_cpp(metadata) -> LlamaCppSPM:
    return LlamaCppSPM(metadata)


@pytest.fixture(scope="module")
def ref(gemma3_path):
    """transformers' tokenizer for the file. Converting the GGUF vocabulary takes ~30 s here, so its result is kept,
    as transformers saved it, in tformer's cache keyed by transformers' version (later runs load it in ~5 s)."""
    transformers = pytest.importorskip("transformers")
    from tformer.core.atomic import atomic_dir, existing_dir
    from tformer.data.packages import cache_dir

    saved = cache_dir() / "reference" / f"gemma3-tokenizer-from-gguf-transformers-{transformers.__version__}"
    if existing_dir(saved) is None:
        converted = transformers.AutoTokenizer.from_pretrained(str(gemma3_path.parent), gguf_file=gemma3_path.name)
        with atomic_dir(saved) as tmp:
            converted.save_pretrained(tmp)
    return transformers.AutoTokenizer.from_pretrained(str(existing_dir(saved)))


def ref_ids(ref, texts: list[str]) -> list[list[int]]:
    return ref(texts, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------
# The real file: what it says, and what transformers builds for it


def test_reads_the_file(tok, ref):
    assert isinstance(tok, GGUFSentencePiece) and tok.model == "llama"
    assert tok.vocab_size == 262_144 == len(ref)
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id, tok.mask_id) == (2, 1, 0, 3, None)
    assert tok.special_ids == {"bos": 2, "eos": 1, "pad": 0, "unk": 3}
    assert tok.add_bos is True and tok.add_eos is False and tok.add_space_prefix is False
    assert len(tok.control_ids) == 6249 and {0, 1, 2, 3, 4, 105, 106} <= tok.control_ids
    assert tok.chat_template is None  # a base model
    assert (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id, ref.unk_token_id) == (2, 1, 0, 3)
    assert tok.describe()["model"] == "llama" and "add_space_prefix=False" in repr(tok)


def test_transformers_respells_the_space_runs(ref):
    """What the comparison rests on: spaces become ``▁`` before one BPE over the whole piece, byte fallback, and the
    space-run tokens are vocabulary entries ``▁▁``... (not added tokens), merged by rank."""
    engine = ref.backend_tokenizer
    assert json.loads(engine.normalizer.__getstate__()) == {"type": "Replace", "pattern": {"String": " "},
                                                            "content": "\u2581"}
    assert type(engine.model).__name__ == "BPE" and engine.model.byte_fallback
    assert engine.token_to_id("\u2581" * 2) == 138 and engine.token_to_id("  ") is None
    assert not set(range(138, 168)) & set(engine.get_added_tokens_decoder())
    assert ref("a" + " " * 37 + "b", add_special_tokens=False)["input_ids"] == [236746, 152, 157, 236763]  # 16 + 21


def test_space_runs_as_llama_cpp(tok, tok_hf_reading, llama_cpp):
    for n in range(2, 32):
        assert tok.encode("a" + " " * n + "b") == [236746, 136 + n, 236763]
    assert tok.encode("a" + " " * 37 + "b") == [236746, 167, 142, 236763]  # 31 + 6, as llama.cpp
    assert tok_hf_reading.encode("a" + " " * 37 + "b") == [236746, 152, 157, 236763]  # as transformers
    assert tok.encode(" " * 32 + "b") == [167, *tok.encode(" b")]  # 31, then "▁b"
    for n in (32, 33, 62, 63, 64, 100):
        for text in (" " * n, "x" + " " * n + "y", "\n" + " " * n + "def", "\t" + " " * n):
            assert tok.encode(text) == llama_cpp.encode(text), (n, text)


def test_equals_llama_cpp_written_out(tok, llama_cpp):
    """On the sample (plain and with control tokens matched) and on every 5th line of Shakespeare's validation split
    and WikiText-2's test split."""
    texts = SAMPLES + [CHAT]
    assert tok.encode_batch(texts) == [llama_cpp.encode(t) for t in texts]
    assert tok.encode_batch(texts, special=True) == [llama_cpp.encode(t, special=True) for t in texts]
    lines = 0
    for text in (get_corpus("shakespeare").text("validation"), get_corpus("wikitext2").text("test")):
        sample = segments(text)[::5]
        assert tok.encode_batch(sample) == [llama_cpp.encode(s) for s in sample]
        lines += len(sample)
    assert lines > 3500


# ---------------------------------------------------------------------------------------------
# Token-for-token against transformers: the corpora and the sample


def compare(name: str, text: str, tok, tok_hf_reading, llama_cpp, ref, chunks: int = 1024) -> dict:
    """Ids of ``text`` from ours and from transformers, in ``chunks`` batches of whole segments; differing chunks
    are compared segment by segment. Round trip checked on every chunk."""
    segs = segments(text)
    assert "".join(segs) == text
    step = -(-len(segs) // chunks)
    spans = [(a, min(a + step, len(segs))) for a in range(0, len(segs), step)]
    pieces = ["".join(segs[a:b]) for a, b in spans]
    start = time.perf_counter()
    ours = tok.encode_batch(pieces)
    took = time.perf_counter() - start
    theirs = ref_ids(ref, pieces)
    bad_segments = bad_tokens = runs = 0
    examples = []
    for (a, b), piece, mine, their in zip(spans, pieces, ours, theirs):
        assert tok.decode(mine) == piece  # round trip
        if mine == their:
            continue
        part = segs[a:b]
        for seg, m, t, h in zip(part, tok.encode_batch(part), ref_ids(ref, part), tok_hf_reading.encode_batch(part)):
            if m == t:
                continue
            found = _LONG_SPACES.findall(seg)
            assert found, f"{name}: a segment without a run of over 31 spaces differs: {seg[:200]!r}"
            assert m == llama_cpp.encode(seg), f"{name}: ours is not llama.cpp's on {seg[:200]!r}"
            assert h == t, f"{name}: ours from transformers' reading differs from transformers on {seg[:200]!r}"
            runs += len(found)
            bad_segments += 1
            bad_tokens += max(len(m), len(t))
            if len(examples) < 3:
                examples.append(seg[:60])
    stats = {"corpus": name, "characters": len(text), "lines": text.count("\n"), "segments": len(segs),
             "tokens": sum(map(len, ours)), "transformers_tokens": sum(map(len, theirs)),
             "differing_segments": bad_segments, "long_space_runs_in_them": runs,
             "tokens_in_differing_segments": bad_tokens, "encode_s": round(took, 2)}
    print(f"\n{stats}\n  differing, e.g.: {examples}")
    return stats


def test_shakespeare_equals_transformers(tok, tok_hf_reading, llama_cpp, ref):
    corpus = get_corpus("shakespeare")
    text = corpus.text("train") + corpus.text("validation")
    stats = compare("shakespeare", text, tok, tok_hf_reading, llama_cpp, ref)
    assert stats["tokens"] > 1_300_000 and stats["differing_segments"] < 0.001 * stats["segments"]


def test_wikitext2_equals_transformers(tok, tok_hf_reading, llama_cpp, ref):
    text = get_corpus("wikitext2").text("test")
    stats = compare("wikitext2-test", text, tok, tok_hf_reading, llama_cpp, ref)
    assert stats["tokens"] > 280_000 and stats["differing_segments"] == 0
    # the pieces' ids concatenated are the whole text's ids
    whole = tok.encode(text)
    assert whole == [i for seg in tok.encode_batch(segments(text)) for i in seg]
    assert tok.decode(whole) == text


def test_samples_equal_transformers(tok, tok_hf_reading, ref):
    # transformers always matches control tokens in the text: compared with special=True
    ours, theirs = tok.encode_batch(SAMPLES, special=True), ref_ids(ref, SAMPLES)
    differing = []
    for text, m, t, h, plain in zip(SAMPLES, ours, theirs, tok_hf_reading.encode_batch(SAMPLES, special=True),
                                    tok.encode_batch(SAMPLES)):
        assert tok.encode(text, special=True) == m and tok.encode(text) == plain
        if "\u2581" not in text:  # SentencePiece's space: decodes as " "
            assert tok.decode(m) == text == tok.decode(plain)  # round trips
            assert ref.decode(m) == text  # and decodes as transformers does
        assert h == t, text
        if not _LONG_SPACES.search(text):
            assert m == t, text
        if m != t:
            differing.append(text[:40])
    print(f"\nsample: {len(SAMPLES)} texts, {sum(map(len, ours))} tokens, {len(differing)} differ (long space runs): "
          f"{differing}")
    assert differing == ["a" + " " * 32 + "b" + " " * 6]  # the sample with runs of 32, 41 and 63 spaces
    assert tok.decode(tok.encode("a\u2581b")) == "a b" == ref.decode(ref_ids(ref, ["a\u2581b"])[0])


def test_add_special_tokens_as_transformers(tok, ref):
    for text in ("Hello", CHAT, ""):
        assert tok.encode(text, add_special_tokens=True, special=True) == ref(text)["input_ids"]  # BOS in front
        assert tok.encode_batch([text], add_special_tokens=True) == [[2, *tok.encode(text)]]


def test_encodes_wikitext2_in_seconds(tok):
    text = get_corpus("wikitext2").text("test")
    start = time.perf_counter()
    ids = tok.encode_batch(segments(text))
    took = time.perf_counter() - start
    print(f"\nWikiText-2 test: {sum(map(len, ids)):,} tokens in {took:.2f} s")
    assert took < 30


# ---------------------------------------------------------------------------------------------
# Special and user-defined tokens, decoding, saving


def test_control_tokens_whole_only_when_asked(tok, ref):
    assert tok.encode("<start_of_turn>", special=True) == [105]
    assert tok.encode("<end_of_turn>", special=True) == [106]
    for name in ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unused17>"):
        plain = tok.encode(name)
        assert len(plain) > 1 and not set(plain) & tok.control_ids
        assert tok.decode(plain) == name
    chat = tok.encode(CHAT, special=True)
    assert chat == ref_ids(ref, [CHAT])[0]
    assert chat.count(105) == 2 and chat.count(106) == 1 and tok.decode(chat) == CHAT
    assert tok.decode(chat, skip_special=True) == CHAT.replace("<start_of_turn>", "").replace("<end_of_turn>", "")
    assert tok.decode([2, 105, 1]) == "<bos><start_of_turn><eos>" and tok.decode([2, 105, 1], skip_special=True) == ""
    assert not set(tok.encode(CHAT)) & tok.control_ids


def test_user_defined_tokens_always_whole(tok):
    assert tok.encode("<b>x</b>")[::2] == [200, 209] and tok.encode("<b>x</b>", special=True)[0] == 200
    assert tok.encode("\n") == [107] and tok.encode("\n\n\n") == [109] and tok.encode("\t\t") == [255969]
    assert tok.encode("\n" * 40) == [137, 115]  # 31 + 9
    assert tok.decode([200], skip_special=True) == "<b>"  # not a control token: kept


def test_chat_stops_at_end_of_turn(tok):
    from tformer.generate.chat import stop_ids

    assert stop_ids(tok, tok.eos_id) == [1, 106]


def test_decode_refuses_ids_outside_the_vocabulary(tok):
    for ids in ([262_144], [5, -1], [10**12]):
        with pytest.raises(TformerError, match="out of range") as err:
            tok.decode(ids)
        assert "\n" not in str(err.value)
    assert tok.decode(np.array([9259, 1902])) == "Hello world"
    assert tok.decode([242, 248, 0xC3 + 238, 0xA9 + 238]) == "\x04\x0aé"  # byte tokens fused into characters


def test_text_that_is_not_unicode_is_refused(tok):
    for bad in ("ok \ud800 no", b"bytes"):
        with pytest.raises(TformerError, match="surrogate U\\+D800 at position 3|encodes text") as err:
            tok.encode(bad)
        assert "\n" not in str(err.value)
        with pytest.raises(TformerError, match="surrogate U\\+D800 at position 3|encodes text"):
            tok.encode_batch(["fine", bad])


def test_save_reads_back(tok, tmp_path):
    path = tok.save(tmp_path / "tok")
    back = hf_tokenizer(path.parent)
    for text in SAMPLES[:16] + [CHAT]:
        assert back.encode(text, add_special_tokens=True) == tok.encode(text, add_special_tokens=True, special=True)
        assert back.decode(tok.encode(text)) == text


# ---------------------------------------------------------------------------------------------
# Synthetic vocabularies: scores, the space prefix, byte fallback, and every refusal in one line


BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def small(**changes) -> dict:
    """Control <unk> <s> </s>, a user-defined <u>, every byte, and a few pieces whose scores disagree with their ids."""
    pieces = ["\u2581", "a", "b", "c", "ab", "bc", "\u2581a", "\u2581ab", "é"]
    tokens = ["<unk>", "<s>", "</s>", "<u>", *BYTE_TOKENS, *pieces]
    scores = [0.0] * 4 + [0.0] * 256 + [-1.0, -2.0, -3.0, -4.0, -9.0, -5.0, -6.0, -7.0, -8.0]  # "bc" beats "ab"
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(scores, dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([3, 3, 3, 4] + [6] * 256 + [1] * len(pieces), dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    meta.update(changes)
    return {k: v for k, v in meta.items() if v is not None}


def test_small_vocabulary_merges_by_score(tmp_path):
    meta = small(**{"tokenizer.ggml.add_space_prefix": False})
    tok, oracle = tokenizer_from_gguf(meta), LlamaCppSPM(meta)
    ids = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    assert tok.encode("abc") == [ids["a"], ids["bc"]]  # by score: "bc" first, though "ab" has the lower id
    assert tok.encode("xé") == [ids["<0x78>"], ids["é"]]  # byte fallback for "x"
    assert tok.encode("<u>a <s>", special=True) == [3, ids["a"], ids["\u2581"], 1]
    assert tok.encode("<u>a <s>")[:2] == [3, ids["a"]] and 1 not in tok.encode("<u>a <s>")
    assert tok.add_bos and tok.encode("a", add_special_tokens=True) == [1, ids["a"]]  # llama.cpp's default
    for text in ("abc", "ab abc", " a bc", "xé", "<u><u>ab", "a\u2581b", "ñ 😀 abab", "<s>ab</s>", ""):
        assert tok.encode(text) == oracle.encode(text), text
        assert tok.encode(text, special=True) == oracle.encode(text, special=True), text
        if "\u2581" not in text:
            assert tok.decode(tok.encode(text)) == text
    assert hf_tokenizer(tok.save(tmp_path).parent).encode("abc", add_special_tokens=True) == [1, ids["a"], ids["bc"]]


def test_space_prefix_as_llama_cpp():
    meta = small()  # no add_space_prefix key: llama.cpp's default, true
    tok, oracle = tokenizer_from_gguf(meta), LlamaCppSPM(meta)
    ids = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    assert tok.add_space_prefix and tok.encode("ab") == [ids["\u2581ab"]]
    assert tok.encode("ab<u>ab") == [ids["\u2581ab"], 3, ids["\u2581ab"]]  # every piece gets one
    for text in ("ab", " ab", "ab<u>ab", "<u>", "a b c", "<s>ab"):
        assert tok.encode(text) == oracle.encode(text), text
        assert tok.encode(text, special=True) == oracle.encode(text, special=True), text
    assert tok.decode(tok.encode("ab c")) == "ab c" and tok.decode(tok.encode(" ab")) == " ab"
    assert tok.decode(tok.encode("ab<u>ab")) == "ab<u> ab"  # llama.cpp drops the first token's space only


@pytest.mark.parametrize("changes, fragments", [
    ({"tokenizer.ggml.scores": None}, ["no tokenizer.ggml.scores"]),
    ({"tokenizer.ggml.scores": np.zeros(3, np.float32)}, ["scores has 3 entries", "tokens has 269"]),
    ({"tokenizer.ggml.scores": np.full(269, np.nan, np.float32)}, ["scores of token 0 is nan", "not a finite"]),
    ({"tokenizer.ggml.scores": "x"}, ["scores is", "not an array of numbers"]),
    ({"tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "<u>", *BYTE_TOKENS[:-1], *"abcdefghi", "é"]},
     ["no byte token <0xFF>", "1 of the 256 missing"]),
    ({"tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "<u>", *BYTE_TOKENS, *"abcdefgh", "a"]},
     ['holds "a" twice (ids 260 and 268)']),
    ({"tokenizer.ggml.tokens": ["", "<s>", "</s>", "<u>", *BYTE_TOKENS, *"abcdefghi"]},
     ["token 0 is an empty control token"]),
    ({"tokenizer.ggml.token_type": np.ones(2, np.int32)}, ["token_type has 2 entries"]),
    ({"tokenizer.ggml.bos_token_id": -1}, ["add_bos_token, llama.cpp's default", "no tokenizer.ggml.bos_token_id"]),
    ({"tokenizer.ggml.add_space_prefix": 1}, ["add_space_prefix is 1", "not a boolean"]),
    ({"tokenizer.ggml.model": "t5"}, ['"t5"', '"gpt2" (byte-level BPE), "llama" (SentencePiece)']),
])
def test_bad_metadata_is_one_line(changes, fragments):
    with pytest.raises(TformerError) as err:
        tokenizer_from_gguf(small(**changes))
    message = str(err.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
