"""`tformer count --attn KIND` and its settings: the flags become config fields, the ledger costs the
kind the config names, and a kind that cannot run as asked is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from tformer.cli import main
from tformer.core.attention_kinds import ATTN_KINDS
from tformer.cost.attention import ATTENTION_COSTS


def _count(capsys, *argv):
    assert main(["count", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_attention_summary_names_the_kind_costed_and_sums_its_rows(capsys):
    out = _count(capsys, "--preset", "gpt2", "--seq", "512")
    att = out["attention"]
    assert att["kind"] == "reference" and att["family"] == "exact"  # sdpa's config, scores materialised
    core = [op for op in out["ops"] if op["phase"] == "forward" and op["kind"] in ("scores", "softmax", "context")]
    assert att["matmul_flops"] == sum(op["matmul_flops"] for op in core) > 0
    assert att["written_per_layer"] == sum(op["bytes_written"] for op in core if ".layers.0." in op["name"])
    fused = _count(capsys, "--preset", "gpt2", "--seq", "512", "--fused-attention")["attention"]
    assert fused["kind"] == "sdpa" and fused["matmul_flops"] == att["matmul_flops"]
    assert fused["written_per_layer"] < att["written_per_layer"]  # no n x n scores written


@pytest.mark.parametrize("kind", sorted(set(ATTENTION_COSTS) - {"sdpa", "reference"}))  # those two follow --fused-attention
def test_attn_flag_sets_the_kind_the_ledger_costs(capsys, kind):
    causal = ATTN_KINDS[kind].causal
    out = _count(capsys, "--preset", "gpt2" if causal else "bert-base", "--seq", "256", "--attn", kind, "--window", "64")
    assert out["attention"]["kind"] == kind and out["attention"]["matmul_flops"] > 0


@pytest.mark.parametrize("argv, words", [
    (["--attn", "sliding"], "needs attn_window"),
    (["--preset", "gpt2", "--attn", "linformer"], "cannot be causal"),
    (["--attn", "flashy"], "attn_impl='flashy' is unknown"),
    (["--attn", "sliding", "--window", "0"], "--window must be a whole number in [1, 1e15]"),
    (["--preset", "bert-base", "--attn", "longformer", "--window", "8", "--dilation", "-1"], "--dilation must be a whole number in [1, 1e15]"),
])
def test_bad_attention_settings_are_one_line_and_exit_2(capsys, argv, words):
    assert main(["count", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err
