"""The hostile-input campaign, part 2 (issue 21): profile, train, generate, translate, export, report and data.

Each case builds a hostile input in its own folder (damaged checkpoints: weights cut in half, a header
that lies about its length, tensors of the wrong shape, a pickle where safetensors belong; Hugging Face
folders of unknown or lying configs; output folders that are files, under a file or read-only; a
--resume of a folder that is not a run; bad numbers and names) and runs the real CLI as a user does,
`python -m tformer ...` in a subprocess. Every case must end with exit status 2, its last stderr line
`tformer <command>: error: ...` naming the problem, no traceback anywhere, and every file in its folder
byte-identical afterwards (a refused --out is not created; a pickle is never run). CAMPAIGN_CASES
counts the cases here (85 when written; 2 skip as root; 3 are argparse usage errors);
CAMPAIGN_CASES_TOTAL adds part 1 (test_campaign_cost.py): 174 when written.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import pytest
from campaign_kit import TINY, case, run_case
from test_campaign_cost import CAMPAIGN_CASES as COST_CASES

AS_ROOT = os.geteuid() == 0
READ_ONLY = pytest.mark.skipif(AS_ROOT, reason="root ignores folder permissions")
HARDWARE = {"name": "lab-gpu", "peak_flops": {"fp32": 1e12}, "bandwidth": 1e11}


def tiny(k, **changes) -> str:
    return k.json("tiny.json", {**TINY, **changes})


def hw(k) -> str:
    return k.json("hw.json", HARDWARE)


def train(k, *extra, out="run") -> list[str]:
    """A training command that would finish in a second if the hostile part were accepted."""
    return ["train", "--config", tiny(k), "--data", k.text("corpus.txt", "hello world\n" * 50), "--max-steps", "1",
            "--out", str(k.dir / out), *extra]


def read_only(k, name="locked") -> str:
    folder = k.folder(name)
    os.chmod(folder, 0o500)
    return str(Path(folder) / "out")


def weights(k, name="ckpt", kind="decoder") -> Path:
    return k.ckpt(name, kind) / "model.safetensors"


def cut_in_half(k) -> str:
    w = weights(k)
    data = w.read_bytes()
    w.write_bytes(data[: len(data) // 2])
    return str(w.parent)


def header_lies(k) -> str:
    w = weights(k)
    data = w.read_bytes()
    w.write_bytes(struct.pack("<Q", 10 ** 12) + data[8:])
    return str(w.parent)


def wrong_shapes(k) -> str:
    """config.json says d_ff 16; the weights are of a model with d_ff 32."""
    good = k.ckpt("good")
    wide = weights(k, "wide-model", "wide")
    wide.replace(good / "model.safetensors")
    return str(good)


def config_lies(k) -> str:
    """config.json says d_model 16 (and n_heads 2); the weights are of d_model 8."""
    folder = k.ckpt()
    (folder / "config.json").write_text(json.dumps({**TINY, "d_model": 16}))
    return str(folder)


class _Touch:
    """Unpickled, this would create a marker file in the case folder (the snapshot would show it)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def pickled_weights(k) -> str:
    w = weights(k)
    w.write_bytes(pickle.dumps({"wte.weight": _Touch(k.dir / "PWNED")}))
    return str(w.parent)


def with_config(k, text: str, kind="decoder") -> str:
    folder = k.ckpt("ckpt", kind)
    (folder / "config.json").write_text(text)
    return str(folder)


def resume(k, args_file: bytes | None = None) -> list[str]:
    """--resume of a folder "run" that holds only a train_args.json (when given): not a run."""
    folder = Path(k.folder("run"))
    if args_file is not None:
        (folder / "train_args.json").write_bytes(args_file)
    return [*train(k), "--resume"]


def resume_pickled(k) -> list[str]:
    """--resume of a run whose checkpoint's weights are a pickle."""
    w = weights(k, "run/checkpoint")
    w.write_bytes(pickle.dumps({"wte.weight": _Touch(k.dir / "PWNED")}))
    return [*train(k), "--resume"]


def existing_run(k) -> list[str]:
    k.folder("run/checkpoint")
    return train(k)


def hf_without_weights(k) -> str:
    folder = k.hf()
    (folder / "model.safetensors").unlink()
    return str(folder)


def empty_weights(k) -> str:
    w = weights(k)
    w.write_bytes(b"")
    return str(w.parent)


def huge_config(k) -> str:
    k.ckpt()
    k.huge("ckpt/config.json")
    return str(k.dir / "ckpt")


def junk_tokenizer(k) -> list[str]:
    k.text("tok/readme.txt", "not a tokenizer")
    return [*train(k), "--tokenizer", str(k.dir / "tok")]


def hf_bad_tokenizer(k) -> str:
    folder = k.hf()
    (folder / "tokenizer.json").write_text('{"model": 3}')
    return str(folder)


PROFILE = [
    case("profile-batch-zero", "--batch")(lambda k: ["profile", "--config", tiny(k), "--hardware", hw(k),
                                                     "--batch", "0"]),
    case("profile-seq-negative", "--seq")(lambda k: ["profile", "--config", tiny(k), "--hardware", hw(k),
                                                     "--seq", "-1"]),
    case("profile-steps-zero", "--steps")(lambda k: ["profile", "--config", tiny(k), "--hardware", hw(k),
                                                     "--steps", "0"]),
    case("profile-warmup-negative", "--warmup")(lambda k: ["profile", "--config", tiny(k), "--hardware", hw(k),
                                                           "--warmup", "-1"]),
    case("profile-decode-encoder", "decode")(
        lambda k: ["profile", "--config", tiny(k, arch="encoder"), "--hardware", hw(k), "--phase", "decode"]),
    case("profile-device-unknown", "tpu")(lambda k: ["profile", "--config", tiny(k), "--hardware", hw(k),
                                                     "--device", "tpu"]),
    case("profile-hardware-unknown", "tpu-v9")(lambda k: ["profile", "--config", tiny(k), "--hardware", "tpu-v9"]),
    case("profile-efficiency-nan", "efficiency")(
        lambda k: ["profile", "--config", tiny(k), "--hardware", hw(k), "--efficiency", "nan"]),
    case("profile-config-nested", "levels deep")(lambda k: ["profile", "--config", k.nested("deep.json")]),
]

TRAIN = [
    case("train-out-is-file", "is a file")(lambda k: train(k, out=Path(k.text("run", "not a folder")).name)),
    case("train-out-under-file", "is a file")(lambda k: train(k, out=Path(k.text("f", "x")).name + "/run")),
    case("train-out-read-only", "cannot be written", marks=READ_ONLY)(
        lambda k: train(k, out=os.path.relpath(read_only(k), k.dir))),
    case("train-resume-not-a-run", "checkpoint")(lambda k: resume(k)),
    case("train-resume-args-binary", "binary")(lambda k: resume(k, b"\0\1")),
    case("train-resume-args-nested", "levels deep")(lambda k: resume(k, b"[" * 5000 + b"]" * 5000)),
    case("train-resume-args-list", "JSON object")(lambda k: resume(k, b"[1, 2]")),
    case("train-resume-pickled-weights", "checkpoint")(resume_pickled),
    case("train-existing-run", "--resume")(existing_run),
    case("train-config-missing", "does not exist")(
        lambda k: ["train", "--config", str(k.dir / "gone.json"), "--out", str(k.dir / "run")]),
    case("train-max-steps-zero", "--max-steps")(lambda k: [*train(k), "--max-steps", "0"]),
    case("train-lr-nan", "--lr")(lambda k: [*train(k), "--lr", "nan"]),
    case("train-eval-interval-zero", "--eval-interval")(lambda k: [*train(k), "--eval-interval", "0"]),
    case("train-beta2-one", "--beta2")(lambda k: [*train(k), "--beta2", "1"]),
    case("train-grad-clip-inf", "--grad-clip")(lambda k: [*train(k), "--grad-clip", "inf"]),
    case("train-lr-not-number", "invalid float")(lambda k: [*train(k), "--lr", "fast"]),
    case("train-batch-size-zero", "--batch-size")(lambda k: [*train(k), "--batch-size", "0"]),
    case("train-grad-accum-negative", "--grad-accum")(lambda k: [*train(k), "--grad-accum", "-1"]),
    case("train-seq-len-negative", "seq-len")(lambda k: [*train(k), "--seq-len", "-1"]),
    case("train-schedule-unknown", "schedule")(lambda k: [*train(k), "--schedule", "sawtooth"]),
    case("train-optimizer-unknown", "optimizer")(lambda k: [*train(k), "--optimizer", "lion"]),
    case("train-precision-unknown", "precision")(lambda k: [*train(k), "--precision", "fp64"]),
    case("train-device-unknown", "tpu")(lambda k: [*train(k), "--device", "tpu"]),
    case("train-data-missing", "gone.txt")(lambda k: [*train(k), "--data", str(k.dir / "gone.txt")]),
    case("train-data-empty", "empty")(lambda k: [*train(k), "--data", k.text("empty.txt", "")]),
    case("train-data-binary", "binary")(lambda k: [*train(k), "--data", k.bytes("blob.txt", b"\0\1\2" * 100)]),
    case("train-tokenizer-junk-folder", "tokenizer")(junk_tokenizer),
    case("train-hf-no-tokenizer", "tokenizer.json")(
        lambda k: ["train", "--hf", hf_without_weights(k), "--tokenizer", "char",
                   "--data", k.text("c.txt", "hi\n" * 50), "--out", str(k.dir / "run")]),
]

GENERATE = [
    case("generate-no-source", "required")(lambda k: ["generate", "--prompt-ids", "1"]),
    case("generate-ckpt-missing", "does not exist")(
        lambda k: ["generate", "--ckpt", str(k.dir / "gone"), "--prompt-ids", "1"]),
    case("generate-ckpt-empty-folder", "config.json")(
        lambda k: ["generate", "--ckpt", k.folder("ckpt"), "--prompt-ids", "1"]),
    case("generate-config-binary", "binary")(
        lambda k: ["generate", "--ckpt", with_config(k, "\0" * 10), "--prompt-ids", "1"]),
    case("generate-config-nested", "levels deep")(
        lambda k: ["generate", "--ckpt", with_config(k, "{" + '"a":{' * 5000 + "}" * 5001), "--prompt-ids", "1"]),
    case("generate-config-huge", "larger than")(
        lambda k: ["generate", "--ckpt", huge_config(k), "--prompt-ids", "1"]),
    case("generate-config-negative-size", "d_model")(
        lambda k: ["generate", "--ckpt", with_config(k, json.dumps({**TINY, "d_model": -8})), "--prompt-ids", "1"]),
    case("generate-weights-cut-in-half", "truncated")(
        lambda k: ["generate", "--ckpt", cut_in_half(k), "--prompt-ids", "1"]),
    case("generate-weights-header-lies", "header")(
        lambda k: ["generate", "--ckpt", header_lies(k), "--prompt-ids", "1"]),
    case("generate-weights-wrong-shapes", "shape")(
        lambda k: ["generate", "--ckpt", wrong_shapes(k), "--prompt-ids", "1"]),
    case("generate-config-lies-about-size", "shape")(
        lambda k: ["generate", "--ckpt", config_lies(k), "--prompt-ids", "1"]),
    case("generate-weights-pickle", "cannot load")(
        lambda k: ["generate", "--ckpt", pickled_weights(k), "--prompt-ids", "1"]),
    case("generate-weights-empty", "model.safetensors")(
        lambda k: ["generate", "--ckpt", empty_weights(k), "--prompt-ids", "1"]),
    case("generate-ckpt-holds-hf", "--hf")(lambda k: ["generate", "--ckpt", str(k.hf()), "--prompt-ids", "1"]),
    case("generate-encoder-ckpt", "cannot generate")(
        lambda k: ["generate", "--ckpt", str(k.ckpt("enc", "encoder")), "--prompt-ids", "1"]),
    case("generate-hf-unknown-model-type", "mamba")(
        lambda k: ["generate", "--hf", str(k.hf(model_type="mamba")), "--prompt-ids", "1"]),
    case("generate-hf-no-model-type", "model_type")(
        lambda k: ["generate", "--hf", str(k.hf(model_type=None)), "--prompt-ids", "1"]),
    case("generate-hf-negative-size", "must be positive")(
        lambda k: ["generate", "--hf", str(k.hf(n_layer=-1)), "--prompt-ids", "1"]),
    case("generate-hf-config-lies-about-size", "shape")(
        lambda k: ["generate", "--hf", str(k.hf(n_embd=16)), "--prompt-ids", "1"]),
    case("generate-hf-no-weights", "weights")(
        lambda k: ["generate", "--hf", hf_without_weights(k), "--prompt-ids", "1"]),
    case("generate-hf-tokenizer-junk", "tokenizer.json")(
        lambda k: ["generate", "--hf", hf_bad_tokenizer(k), "--prompt", "hi"]),
]

TRANSLATE = [
    case("translate-decoder-ckpt", "encoder-decoder")(
        lambda k: ["translate", "--ckpt", str(k.ckpt()), "--source-ids", "1"]),
    case("translate-ckpt-missing", "does not exist")(
        lambda k: ["translate", "--ckpt", str(k.dir / "gone"), "--source-ids", "1"]),
    case("translate-weights-cut-in-half", "truncated")(
        lambda k: ["translate", "--ckpt", cut_in_half(k), "--source-ids", "1"]),
    case("translate-hf-config-list", "JSON object")(
        lambda k: ["translate", "--hf", k.json("hf/config.json", [1]) and str(k.dir / "hf"), "--source-ids", "1"]),
]

EXPORT = [
    case("export-out-is-file", "is a file")(
        lambda k: ["export", "--ckpt", str(k.ckpt()), "--out", k.text("out", "x")]),
    case("export-out-under-file", "is a file")(
        lambda k: ["export", "--ckpt", str(k.ckpt()), "--out", k.text("f", "x") + "/out"]),
    case("export-out-read-only", "cannot be written", marks=READ_ONLY)(
        lambda k: ["export", "--ckpt", str(k.ckpt()), "--out", read_only(k)]),
    case("export-ckpt-missing", "does not exist")(
        lambda k: ["export", "--ckpt", str(k.dir / "gone"), "--out", str(k.dir / "out")]),
    case("export-out-is-ckpt", "itself; inputs are never overwritten")(
        lambda k: ["export", "--ckpt", str(k.ckpt()), "--out", str(k.dir / "ckpt")]),
    case("export-weights-header-lies", "header")(
        lambda k: ["export", "--ckpt", header_lies(k), "--out", str(k.dir / "out")]),
    case("export-no-hf-family", "no Hugging Face family")(
        lambda k: ["export", "--ckpt", str(k.ckpt("ckpt", "alibi")), "--out", str(k.dir / "out")]),
]

REPORT = [
    case("report-out-is-file", "is a file")(
        lambda k: ["report", "--config", tiny(k), "--quick", "--no-train", "--out", k.text("out", "x")]),
    case("report-out-under-file", "out")(
        lambda k: ["report", "--config", tiny(k), "--quick", "--no-train", "--out", k.text("f", "x") + "/a/out"]),
    case("report-out-not-a-report", "not a tformer report")(
        lambda k: ["report", "--config", tiny(k), "--quick", "--no-train", "--out",
                   str(Path(k.text("mine/notes.txt", "keep me")).parent)]),
    case("report-config-missing-new-out", "does not exist")(
        lambda k: ["report", "--config", str(k.dir / "gone.json"), "--quick", "--no-train",
                   "--out", str(k.dir / "new" / "deep" / "out")]),
    case("report-batch-zero", "batch")(
        lambda k: ["report", "--config", tiny(k), "--quick", "--batch", "0", "--out", str(k.dir / "out")]),
    case("report-train-seconds-nan", "--train-seconds")(
        lambda k: ["report", "--config", tiny(k), "--quick", "--train-seconds", "nan", "--out", str(k.dir / "out")]),
    case("report-threads-negative", "threads")(
        lambda k: ["report", "--config", tiny(k), "--quick", "--no-train", "--threads", "-2",
                   "--out", str(k.dir / "out")]),
    case("report-hardware-unknown", "tpu-v9")(
        lambda k: ["report", "--config", tiny(k), "--quick", "--no-train", "--hardware", "tpu-v9",
                   "--out", str(k.dir / "out")]),
]

DATA = [
    case("data-unknown-subcommand", "invalid choice")(lambda k: ["data", "fetch"]),
    case("data-get-unknown-corpus", "no-such-corpus")(lambda k: ["data", "get", "no-such-corpus"]),
    case("data-get-empty-file", "empty")(lambda k: ["data", "get", k.text("empty.txt", "")]),
    case("data-get-binary-file", "binary")(lambda k: ["data", "get", k.bytes("blob.txt", b"\0\1\2" * 100)]),
    case("data-get-not-utf8", "UTF-8")(
        lambda k: ["data", "get", k.bytes("latin.txt", "caf\xe9 ".encode("latin-1") * 50)]),
    case("data-get-empty-folder", "text")(lambda k: ["data", "get", k.folder("corpus")]),
    case("data-get-tokenizer-missing", "tokenizer")(
        lambda k: ["data", "get", k.text("t.txt", "hello world\n" * 50), "--tokenizer", str(k.dir / "gone-tok")]),
    case("data-get-vocab-size-zero", "vocab")(
        lambda k: ["data", "get", k.text("t.txt", "hello world\n" * 50), "--tokenizer", "bpe", "--vocab-size", "0"]),
]

# Wrong-content files (issue 37): the right syntax, the wrong content. A labelled row whose label is null, "nan",
# a fraction or of another type than the others; a config field of the wrong type; a checkpoint's tokenizer that
# disagrees with itself or with the model. Each is one line naming the file and the field or line.
LABELLED_ROWS = [(f"row number {i} says something", "ab"[i % 2]) for i in range(20)]
FINETUNE_FROM = ["--from", "bert-base", "--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2",
                 "--set", "d_ff=64", "--max-steps", "1", "--no-progress"]


def finetune(k, name: str, extra_line: str) -> list[str]:
    """`tformer finetune --data` of twenty good rows and ``extra_line`` (as line 21 of a JSONL, 22 of a CSV)."""
    if name.endswith(".csv"):
        body = "text,label\n" + "".join(f"{t},{y}\n" for t, y in LABELLED_ROWS) + extra_line + "\n"
    else:
        body = "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in LABELLED_ROWS) + extra_line + "\n"
    return ["finetune", *FINETUNE_FROM, "--data", k.text(name, body), "--out", str(k.dir / "run")]


def hf_config(k, **changes) -> str:
    return k.json("hf.json", {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 16,
                              "n_positions": 16, **changes})


def with_tokenizer(k, text: str = "abcdefgh", **descriptor_changes) -> str:
    """A tiny checkpoint with a character tokenizer in its tokenizer/ folder, the descriptor changed."""
    from tformer.data.tokenizers import DESCRIPTOR, CharTokenizer

    folder = k.ckpt()
    CharTokenizer.from_text(text, specials={"pad": "<pad>", "eos": "</s>"}).save(folder / "tokenizer")
    path = folder / "tokenizer" / DESCRIPTOR
    path.write_text(json.dumps({**json.loads(path.read_text()), **descriptor_changes}))
    return str(folder)


def hf_tokenizer_panics(k) -> str:
    """An HF folder whose tokenizer.json parses but makes the library's Rust code panic at the first encode."""
    from tformer.data.tokenizers import ByteBPETokenizer

    folder = k.hf()
    hf = ByteBPETokenizer.train(["hello world"] * 20, vocab_size=300).hf
    doc = json.loads(hf.to_str())
    doc["model"]["continuing_subword_prefix"] = "xxxxx"
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    return str(folder)


WRONG_CONTENT = [
    case("finetune-data-null-label", "line 21: has no label")(
        lambda k: finetune(k, "rows.jsonl", json.dumps({"text": "x", "label": None}))),
    case("finetune-data-nan-label", 'line 22: has label "nan"')(lambda k: finetune(k, "rows.csv", "x,nan")),
    case("finetune-data-float-label", "line 21: has label 1.0")(
        lambda k: finetune(k, "rows.jsonl", json.dumps({"text": "x", "label": 1.0}))),
    case("finetune-data-mixed-labels", "line 21: has label 3 (whole number) but line 1's label")(
        lambda k: finetune(k, "rows.jsonl", json.dumps({"text": "x", "label": 3}))),
    case("finetune-data-line-too-long", "over the limit of 131072")(
        lambda k: finetune(k, "rows.csv", "x" * 200_000 + ",a")),
    case("finetune-data-not-utf8", "not UTF-8 text (byte")(
        lambda k: ["finetune", *FINETUNE_FROM, "--data", k.bytes("rows.csv", b"text,label\nh\xe9llo,a\n"),
                   "--out", str(k.dir / "run")]),
    case("count-config-string-for-int", 'n_layers must be a whole number, got "4"')(
        lambda k: ["count", "--config", tiny(k, n_layers="4")]),
    case("count-config-bool-for-int", "d_model must be a whole number, got true")(
        lambda k: ["count", "--config", tiny(k, d_model=True)]),
    case("count-config-hf-object-for-int", "'n_embd' must be a whole number, got an object")(
        lambda k: ["count", "--config", hf_config(k, n_embd={"size": 8})]),
    case("count-config-hf-null-bool", "'tie_word_embeddings' must be true or false, got null")(
        lambda k: ["count", "--config", hf_config(k, tie_word_embeddings=None)]),
    case("generate-ckpt-config-fraction", "n_layers must be a whole number, got 1.5")(
        lambda k: ["generate", "--ckpt", with_config(k, json.dumps({**TINY, "n_layers": 1.5})), "--prompt-ids", "1"]),
    case("generate-ckpt-tokenizer-special-id", "key 'special_ids.pad' is 3")(
        lambda k: ["generate", "--ckpt", with_tokenizer(k, special_ids={"pad": 3, "eos": 1}), "--prompt", "abc"]),
    case("generate-ckpt-tokenizer-file-escapes", "key 'file'")(
        lambda k: ["generate", "--ckpt", with_tokenizer(k, kind="bpe", file="../config.json"), "--prompt", "abc"]),
    case("generate-ckpt-tokenizer-bigger-than-model", "tokens but the model's vocabulary is 16")(
        lambda k: ["generate", "--ckpt", with_tokenizer(k, text="abcdefghijklmnopqrstuvwxyz"), "--prompt", "abc"]),
    case("generate-hf-tokenizer-panics", "tokenizer.json is not a tokenizer the library can load")(
        lambda k: ["generate", "--hf", hf_tokenizer_panics(k), "--prompt", "hi"]),
]

CASES = PROFILE + TRAIN + GENERATE + TRANSLATE + EXPORT + REPORT + DATA + WRONG_CONTENT
CAMPAIGN_CASES = len(CASES)
CAMPAIGN_CASES_TOTAL = CAMPAIGN_CASES + COST_CASES


@pytest.mark.parametrize("c", CASES)
def test_hostile_input(c, tmp_path, templates):
    run_case(c, tmp_path, templates)
