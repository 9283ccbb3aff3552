"""`tformer generate` and `tformer translate`: output, JSON, and one-line errors with exit status 2."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_checkpoint import write_checkpoint

from tformer.cli import main

TEXT = "to be or not to be, that is the question.\n"


def _checkpoint(path, arch, tokenizer=False, **kw):
    return write_checkpoint(path, arch, tokenizer, TEXT, 32, **kw)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {
        "dec": _checkpoint(root / "dec", "decoder", eos_token_id=3),
        "dec_tok": _checkpoint(root / "dec_tok", "decoder", tokenizer=True),
        "s2s": _checkpoint(root / "s2s", "encoder-decoder", decoder_start_token_id=1, eos_token_id=2),
        "enc": _checkpoint(root / "enc", "encoder"),
    }


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_from_ids(ckpts, capsys):
    code, out, _ = _run(capsys, "generate", "--ckpt", str(ckpts["dec"]), "--prompt-ids", "5,6,7", "--greedy",
                        "--max-new-tokens", "6", "--stop-ids", "", "--json")
    assert code == 0
    data = json.loads(out)
    ids = data["sequences"][0]["ids"]
    assert len(ids) == 6 and data["sequences"][0]["prompt_ids"] == [5, 6, 7]
    assert data["decode_tokens"] == 5 and data["decode_tokens_per_s"] > 0 and data["prefill_tokens_per_s"] > 0
    # the same greedy tokens without the cache and with the growing one (a reserved cache is the default); the
    # old name --static-cache still works, with a one-line notice
    assert data["cache"] == "reserved"
    for flag in ("--no-cache", "--growing-cache", "--static-cache"):
        _, out2, _ = _run(capsys, "generate", "--ckpt", str(ckpts["dec"]), "--prompt-ids", "5,6,7", "--greedy",
                          "--max-new-tokens", "6", "--stop-ids", "", "--json", flag)
        assert json.loads(out2)["sequences"][0]["ids"] == ids
        assert json.loads(out2)["cache"] == {"--no-cache": "none", "--growing-cache": "growing"}.get(flag, "reserved")


@pytest.mark.parametrize("command, key", [("generate", "dec"), ("translate", "s2s")])
def test_compile_gives_the_same_ids_and_reports_compilation_apart(ckpts, capsys, command, key):
    src = "--prompt-ids" if command == "generate" else "--source-ids"
    argv = [command, "--ckpt", str(ckpts[key]), src, "5,6,7", src, "8,9", "--greedy", "--max-new-tokens", "6",
            "--stop-ids", "", "--json"]
    _, plain, _ = _run(capsys, *argv)
    code, out, _ = _run(capsys, *argv, "--compile")
    data = json.loads(out)
    assert code == 0 and data["compiled"] is True and data["compile_seconds"] > 0
    assert [s["ids"] for s in data["sequences"]] == [s["ids"] for s in json.loads(plain)["sequences"]]
    assert data["decode_tokens_per_s"] > 0 and json.loads(plain)["compile_seconds"] == 0


def test_generate_text_with_tokenizer_streams_and_prints_speeds(ckpts, capsys):
    code, out, _ = _run(capsys, "generate", "--ckpt", str(ckpts["dec_tok"]), "--prompt", "to be", "--seed", "0",
                        "--top-k", "5", "--max-new-tokens", "8")
    assert code == 0
    assert "prefill:" in out and "decode:" in out and "tokens/s" in out
    # seeded: the same text twice
    code2, out2, _ = _run(capsys, "generate", "--ckpt", str(ckpts["dec_tok"]), "--prompt", "to be", "--seed", "0",
                          "--top-k", "5", "--max-new-tokens", "8")
    assert code2 == 0 and out.splitlines()[0] == out2.splitlines()[0]


def test_generate_batch_and_beams(ckpts, capsys):
    code, out, _ = _run(capsys, "generate", "--ckpt", str(ckpts["dec"]), "--prompt-ids", "5,6,7", "--batch", "3",
                        "--num-beams", "3", "--max-new-tokens", "5", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["sequences"]) == 3 and len(data["scores"]) == 3
    assert data["sequences"][0]["ids"] == data["sequences"][2]["ids"]  # beam search is deterministic


def test_translate(ckpts, capsys):
    code, out, _ = _run(capsys, "translate", "--ckpt", str(ckpts["s2s"]), "--source-ids", "5,6,7", "--source-ids",
                        "8,9", "--num-beams", "2", "--max-new-tokens", "6", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["sequences"]) == 2
    assert all(1 <= len(s["ids"]) <= 6 for s in data["sequences"])


@pytest.mark.parametrize("argv, message", [
    (["generate", "--ckpt", "{dec}", "--prompt-ids", ""], "empty prompt"),
    (["generate", "--ckpt", "{dec_tok}", "--prompt", ""], "empty prompt"),
    (["generate", "--ckpt", "{dec}", "--prompt-ids", ",".join(["5"] * 40)], "longer than the context window of 32"),
    (["generate", "--ckpt", "{dec}", "--prompt-ids", "5", "--top-p", "1.5"], "--top-p must be a finite number in (0, 1]"),
    (["generate", "--ckpt", "{dec}", "--prompt-ids", "5", "--top-p", "0"], "--top-p must be a finite number in (0, 1]"),
    (["generate", "--ckpt", "{dec}", "--prompt-ids", "5", "--temperature", "-1"], "--temperature must be a finite number in [0, 1e6]"),
    (["generate", "--ckpt", "{dec}", "--prompt-ids", "5", "--min-p", "2"], "--min-p"),
    (["generate", "--ckpt", "{dec}", "--prompt", "hello"], "no tokenizer"),
    (["generate", "--ckpt", "{dec}", "--prompt-ids", "5,x"], "comma-separated whole numbers"),
    (["generate", "--ckpt", "{dec}", "--prompt-ids", "500"], "outside the vocabulary"),
    (["generate", "--ckpt", "{enc}", "--prompt-ids", "5"], "no decoder"),
    (["translate", "--ckpt", "{enc}", "--source-ids", "5"], "no decoder"),
    (["generate", "--ckpt", "{s2s}", "--prompt-ids", "5"], "tformer translate"),
    (["translate", "--ckpt", "{dec}", "--source-ids", "5"], "decoder-only"),
    (["generate", "--ckpt", "/no/such/dir", "--prompt-ids", "5"], "does not exist"),
    (["generate", "--ckpt", "{dec}", "--prompt-ids", "5", "--num-beams", "2", "--top-k", "4"], "does not sample"),
    (["generate", "--ckpt", "{dec}", "--prompt-ids", "5", "--compile", "--no-cache"], "preallocated KV cache"),
    (["generate", "--ckpt", "{enc}", "--prompt-ids", "5", "--compile"], "no decoder"),
])
def test_bad_input_is_one_line_and_exit_2(ckpts, capsys, argv, message):
    argv = [a.format(**{k: str(v) for k, v in ckpts.items()}) for a in argv]
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_truncate_option(ckpts, capsys):
    code, out, _ = _run(capsys, "generate", "--ckpt", str(ckpts["dec"]), "--prompt-ids", ",".join(["5"] * 40),
                        "--truncate", "--greedy", "--max-new-tokens", "4", "--json")
    data = json.loads(out)
    assert code == 0 and data["truncated"] and data["prefill_tokens"] == 28


def test_corrupt_checkpoint(tmp_path, capsys):
    path = _checkpoint(tmp_path / "bad", "decoder")
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    code, _, err = _run(capsys, "generate", "--ckpt", str(path), "--prompt-ids", "5")
    assert code == 2 and "cannot load" in err and len(err.strip().splitlines()) == 1


def test_generate_from_hf_folder_with_tokenizer_json(tmp_path, capsys):
    """--hf DIR: weights through tformer.load_hf, text through the folder's tokenizer.json."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<eos>", "the", "cat", "sat", "on", "mat", "a", "dog"]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()  # joins tokens with spaces
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=len(words), n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path)
    tok.save(str(tmp_path / "tokenizer.json"))
    code, out, _ = _run(capsys, "generate", "--hf", str(tmp_path), "--prompt", "the cat sat", "--greedy",
                        "--max-new-tokens", "5", "--stop-ids", "", "--json")
    data = json.loads(out)
    assert code == 0 and data["sequences"][0]["prompt_ids"] == [1, 2, 3]
    ids = data["sequences"][0]["ids"]
    expected = hf.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, min_new_tokens=5, do_sample=False,
                           pad_token_id=0)[0, 3:].tolist()
    assert ids == expected
    assert data["sequences"][0]["text"] == tok.decode(ids)


@pytest.mark.parametrize("command, extra, default", [
    ("generate", ["--prompt", "hi"], "auto"), ("chat", [], "auto"), ("serve", [], "auto"),
    ("perplexity", [], "dequantize"), ("export", ["--out", "o"], "dequantize"), ("quantize", ["--out", "o", "--to", "int8"], "dequantize"),
])
def test_a_gguf_file_decodes_on_the_block_kernel_by_default_and_is_scored_and_rewritten_in_fp32(command, extra, default):
    """Issue 48's defaults: the commands that decode take the kernel where it is built (auto); perplexity scores
    512-token rows, where fp32 GEMM is faster, and the commands that rewrite weights read their exact values."""
    from tformer.cli import build_parser

    args = build_parser().parse_args([command, "--gguf", "model.gguf", *extra])
    assert args.gguf_weights == default
