"""The hostile-input campaign, part 3 (issue 37): inputs at the edges, by class.

- non-UTF-8 text: undecodable bytes on the command line (Python hands them over as lone surrogates, '\\udcff'),
  on standard input, and lone surrogates a JSON file spells ("\\ud800"), wherever text reaches a tokenizer,
  a name lookup or the terminal;
- float64 edges: inf, -inf, nan, 1e308, 1e-320 (subnormal), -0.0, 400-digit integers and zero divisors in the
  cost commands, the attention walkthrough, the device descriptions and the generation settings;
- degenerate names: '', '   ', '.', NUL or a newline where a preset, model, corpus, device or file is named.

Same machinery and rules as parts 1 and 2 (tests/cli/campaign_kit.py): each case runs the real CLI in a
process of its own and must end with exit status 2, one last line `tformer <command>: error: ...` holding the
needle (the flag, the field or the stream at fault), no traceback, and its folder byte-identical afterwards.
EDGE_CASES counts them, by class in EDGE_CLASSES.
"""

from __future__ import annotations

import json

import pytest
from campaign_kit import TINY, case, run_case

BIG = str(10 ** 400)
HARDWARE = {"name": "lab-gpu", "peak_flops": {"fp32": 1e12}, "bandwidth": 1e11}


def tiny(k) -> str:
    return k.json("tiny.json", TINY)


def hw(k, **changes) -> str:
    return k.text("hw.json", json.dumps({**HARDWARE, **changes}))


def on_hardware(k, command: str, *extra: str) -> list[str]:
    return [command, "--config", tiny(k), "--hardware", hw(k), *extra]


def gen(k, *extra: str, command: str = "generate", kind: str = "decoder") -> list[str]:
    """A decoding command on a tiny checkpoint, then ``extra``."""
    return [command, "--ckpt", str(k.ckpt(kind=kind)), "--max-new-tokens", "2", *extra]


def example(k, **matrices) -> str:
    """An attention walkthrough input: the one-feature example with ``matrices`` replaced (raw JSON text)."""
    base = {"X": "[[1]]", "W_Q": "[[1]]", "W_K": "[[1]]", "W_V": "[[1]]", **matrices}
    return k.text("m.json", "{" + ", ".join(f'"{key}": {value}' for key, value in base.items()) + "}")


NON_UTF8 = [
    case("utf8-generate-prompt", "--prompt")(lambda k: gen(k, "--prompt", "to be \udcff or not")),
    case("utf8-generate-stdin", "standard input")(lambda k: (gen(k), b"to be \xff or not")),
    case("utf8-generate-stdin-cut-sequence", "byte 3")(lambda k: (gen(k), b"abc\xe2\x82")),
    case("utf8-translate-sentence", "sentences")(
        lambda k: gen(k, "caf\udce9", command="translate", kind="seq2seq")),
    case("utf8-translate-stdin", "standard input")(lambda k: (gen(k, command="translate", kind="seq2seq"),
                                                              b"Good morning.\n\xc0\xaf\n")),
    case("utf8-attention-input-name", "--input")(lambda k: ["attention", "--walkthrough", "--input", "m\udcff.json"]),
    case("utf8-attention-token", "token 2")(
        lambda k: ["attention", "--walkthrough", "--input",
                   example(k, X="[[1], [2]]", tokens='["I", "\\ud800"]')]),
    case("utf8-count-preset", "--preset")(lambda k: ["count", "--preset", "gpt\udcff"]),
    case("utf8-count-set", "--set")(lambda k: ["count", "--config", tiny(k), "--set", "attn_impl=\udcff"]),
    case("utf8-scale-knobs", "--knobs")(lambda k: ["scale", "--config", tiny(k), "--knobs", "d_model,\udce9"]),
    case("utf8-report-sentence", "--sentence")(lambda k: ["report", "--sentence", "\udcc3 la carte", "--out",
                                                          str(k.dir / "rep")]),
    case("utf8-train-data", "--data")(lambda k: ["train", "--data", "shakes\udcffpeare", "--out", str(k.dir / "run")]),
    case("utf8-data-name", "name")(lambda k: ["data", "get", "\udcff"]),
    case("utf8-serve-api-key", "--api-key")(lambda k: ["serve", "--ckpt", str(k.ckpt()), "--api-key", "k\udcff"]),
]

FLOAT_EDGES = [
    case("edge-count-batch-huge", "--batch")(lambda k: ["count", "--config", tiny(k), "--batch", BIG]),
    case("edge-count-seq-huge", "--seq")(lambda k: ["count", "--config", tiny(k), "--seq", BIG]),
    case("edge-count-efficiency-subnormal", "--efficiency")(
        lambda k: on_hardware(k, "count", "--efficiency", "1e-320")),
    case("edge-count-efficiency-negative-zero", "--efficiency")(
        lambda k: on_hardware(k, "count", "--efficiency", "-0.0")),
    case("edge-count-link-bandwidth-max", "--link-bandwidth")(
        lambda k: ["count", "--config", tiny(k), "--devices", "2", "--link-bandwidth", "1e308"]),
    case("edge-count-link-bandwidth-subnormal", "--link-bandwidth")(
        lambda k: ["count", "--config", tiny(k), "--devices", "2", "--link-bandwidth", "1e-320"]),
    case("edge-count-link-latency-max", "--link-latency")(
        lambda k: ["count", "--config", tiny(k), "--devices", "2", "--link-latency", "1e308"]),
    case("edge-count-set-d-model-max", "d_model")(lambda k: ["count", "--config", tiny(k), "--set", "d_model=1e308"]),
    case("edge-count-window-huge", "--window")(
        lambda k: ["count", "--config", tiny(k), "--attn", "sliding", "--window", BIG]),
    case("edge-count-image-size-huge", "--image-size")(
        lambda k: ["count", "--preset", "vit-base-16", "--image-size", "10000000"]),
    case("edge-hardware-bandwidth-subnormal", "bandwidth")(
        lambda k: ["count", "--config", tiny(k), "--hardware", hw(k, bandwidth=1e-320)]),
    case("edge-hardware-peak-huge-int", "peak_flops.fp32")(
        lambda k: ["count", "--config", tiny(k), "--hardware",
                   k.text("hw.json", '{"name": "x", "peak_flops": {"fp32": ' + BIG + '}, "bandwidth": 1e11}')]),
    case("edge-hardware-memory-infinity", "memory_bytes")(
        lambda k: ["count", "--config", tiny(k), "--hardware", hw(k, memory_bytes=1e308 * 10)]),
    case("edge-scale-factor-max", "--factor")(lambda k: ["scale", "--config", tiny(k), "--factor", "1e308"]),
    case("edge-scale-factor-subnormal", "--factor")(lambda k: ["scale", "--config", tiny(k), "--factor", "1e-320"]),
    case("edge-scale-budget-subnormal", "--budget")(lambda k: ["scale", "--config", tiny(k), "--budget", "1e-320"]),
    case("edge-scale-budget-max", "--budget")(lambda k: ["scale", "--config", tiny(k), "--budget", "1e308"]),
    case("edge-scale-train-tokens-max", "--train-tokens")(
        lambda k: on_hardware(k, "scale", "--train-tokens", "1e308")),
    case("edge-scale-utilization-zero", "--utilization")(
        lambda k: on_hardware(k, "scale", "--train-tokens", "1e9", "--utilization", "-0.0")),
    case("edge-scale-price-max", "--price")(
        lambda k: on_hardware(k, "scale", "--train-tokens", "1e9", "--price", "1e308")),
    case("edge-scale-devices-huge", "--devices")(
        lambda k: on_hardware(k, "scale", "--train-tokens", "1e9", "--devices", BIG)),
    case("edge-specs-clock-max", "--clock-ghz")(lambda k: ["specs", "--clock-ghz", "1e308"]),
    case("edge-attention-entry-max", "X row 1")(
        lambda k: ["attention", "--walkthrough", "--input", example(k, X="[[1e308]]", W_Q="[[1e308]]")]),
    case("edge-attention-entry-huge-int", "W_K row 1")(
        lambda k: ["attention", "--walkthrough", "--input", example(k, W_K=f"[[{BIG}]]")]),
    case("edge-attention-decimals-huge", "--decimals")(lambda k: ["attention", "--walkthrough", "--decimals", BIG]),
    case("edge-generate-temperature-inf", "--temperature")(lambda k: gen(k, "--prompt-ids", "1", "--temperature",
                                                                         "inf")),
    case("edge-generate-temperature-max", "--temperature")(lambda k: gen(k, "--prompt-ids", "1", "--temperature",
                                                                         "1e308")),
    case("edge-generate-top-p-nan", "--top-p")(lambda k: gen(k, "--prompt-ids", "1", "--top-p", "nan")),
    case("edge-generate-min-p-inf", "--min-p")(lambda k: gen(k, "--prompt-ids", "1", "--min-p", "inf")),
    case("edge-generate-repetition-penalty-zero", "--repetition-penalty")(
        lambda k: gen(k, "--prompt-ids", "1", "--repetition-penalty", "-0.0")),
    case("edge-generate-length-penalty-max", "--length-penalty")(
        lambda k: gen(k, "--prompt-ids", "1", "--num-beams", "2", "--length-penalty=-1e308")),
    case("edge-generate-max-new-tokens-huge", "--max-new-tokens")(
        lambda k: gen(k, "--prompt-ids", "1", "--max-new-tokens", BIG)),
    case("edge-translate-length-penalty-nan", "--length-penalty")(
        lambda k: gen(k, "--source-ids", "1", "--length-penalty", "nan", command="translate", kind="seq2seq")),
    case("edge-serve-request-timeout-inf", "--request-timeout")(
        lambda k: ["serve", "--ckpt", str(k.ckpt()), "--request-timeout", "inf"]),
    case("edge-serve-port-huge", "--port")(lambda k: ["serve", "--ckpt", str(k.ckpt()), "--port", BIG]),
]

DEGENERATE_NAMES = [
    case("name-count-preset-empty", "--preset is empty")(lambda k: ["count", "--preset", ""]),
    case("name-count-preset-blank", "--preset is blank")(lambda k: ["count", "--preset", "   "]),
    case("name-count-preset-dot", "--preset is '.'")(lambda k: ["count", "--preset", "."]),
    case("name-count-preset-nul", "--preset")(lambda k: ["count", "--preset", "gpt2\x00"]),
    case("name-count-preset-newline", "--preset")(lambda k: ["count", "--preset", "gpt2\nbert-base"]),
    case("name-count-config-empty", "--config is empty")(lambda k: ["count", "--config", ""]),
    case("name-count-hardware-empty", "--hardware is empty")(lambda k: ["count", "--config", tiny(k), "--hardware", ""]),
    case("name-count-hf-blank", "--hf is blank")(lambda k: ["count", "--hf", "\t"]),
    case("name-count-objective-empty", "--objective is empty")(
        lambda k: ["count", "--config", tiny(k), "--objective", ""]),
    case("name-generate-ckpt-empty", "--ckpt is empty")(lambda k: ["generate", "--ckpt", "", "--prompt-ids", "1"]),
    case("name-generate-hf-newline", "--hf")(lambda k: ["generate", "--hf", "gpt2\n", "--prompt-ids", "1"]),
    case("name-generate-preset-dot", "--preset")(lambda k: ["generate", "--preset", "..", "--prompt-ids", "1"]),
    case("name-train-data-empty", "--data is empty")(lambda k: ["train", "--data", "", "--out", str(k.dir / "run")]),
    case("name-train-out-nul", "--out")(lambda k: ["train", "--out", "run\x00"]),
    case("name-train-tokenizer-blank", "--tokenizer is blank")(
        lambda k: ["train", "--tokenizer", " ", "--out", str(k.dir / "run")]),
    case("name-data-get-empty", "name is empty")(lambda k: ["data", "get", ""]),
    case("name-data-get-newline", "name")(lambda k: ["data", "get", "shakes\npeare"]),
    case("name-attention-input-dot", "--input")(lambda k: ["attention", "--walkthrough", "--input", "."]),
    case("name-export-out-blank", "--out is blank")(lambda k: ["export", "--ckpt", str(k.ckpt()), "--out", "  "]),
    case("name-finetune-from-empty", "--from is empty")(lambda k: ["finetune", "--from", ""]),
    case("name-report-out-empty", "--out is empty")(lambda k: ["report", "--out", ""]),
]

EDGE_CLASSES = {"non-UTF-8 text": NON_UTF8, "float64 edges": FLOAT_EDGES, "degenerate names": DEGENERATE_NAMES}
CASES = NON_UTF8 + FLOAT_EDGES + DEGENERATE_NAMES
EDGE_CASES = len(CASES)


@pytest.mark.parametrize("c", CASES)
def test_edge_input(c, tmp_path, templates):
    run_case(c, tmp_path, templates)
