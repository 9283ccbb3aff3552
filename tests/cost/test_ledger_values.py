"""Known values, memory recipes and activation accounting, roofline, scaling — through the public API."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from tformer.core.config import preset
from tformer.cost import scaling as S
from tformer.machine import Device
from tformer.cost.ledger import Workload, ledger
from tformer.cost.roofline import roofline
from tformer.core.errors import TformerError

A100 = Device("a100-test", "gpu", {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12}, bandwidth=2.039e12, source="test")


# Known values --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,kw,expected", [
    ("gpt2", dict(batch=1, seq=1024), 291_648_307_200),
    ("bert-base", dict(batch=1, seq=128), 22_348_431_360),
    ("char-small", dict(batch=64, seq=128), 56_107_204_608),
    ("char-small", dict(batch=64, seq=128, phase="train"), 168_321_613_824),
    ("llama-7b", dict(batch=1, seq=512), 6_903_086_186_496),
])
def test_known_matmul_flops(name, kw, expected):
    assert ledger(preset(name), **kw).flops["matmul"] == expected


def test_llama7b_fp16_kv_cache_per_token():
    config = preset("llama-7b")
    assert ledger(config, phase="prefill", seq=1, dtype="fp16").memory["kv_cache"] == 524_288
    assert ledger(config, phase="prefill", seq=1000, dtype="fp16").memory["kv_cache"] == 524_288 * 1000
    assert ledger(config, phase="decode", seq=10, context=9, dtype="fp16").memory["kv_cache_per_token"] == 524_288


def test_llama70b_at_4096_is_closed_form():
    # The ledger is arithmetic per op: its op list depends on the layers, never on the sequence length, so a
    # 4096-token 70B training step costs what a 16-token one does. (Its time is a figure: bench/cli_latency.py.)
    config = preset("llama-70b")
    lg = ledger(config, phase="train", seq=4096, dtype="bf16", mixed_precision=True)
    _ = lg.memory, lg.params, lg.flops, lg.rules_of_thumb
    short = ledger(config, phase="train", seq=16, dtype="bf16", mixed_precision=True)
    assert [(op.name, op.kind) for op in lg.ops] == [(op.name, op.kind) for op in short.ops]
    assert len(lg.ops) < 100 * config.n_layers
    assert lg.params["total"] == 68_976_648_192  # Llama 2 70B (GQA, 8 KV heads), HF numel


# FLOP accounting ------------------------------------------------------------------------------------------------
def test_causal_accounting_counts_only_unmasked_pairs():
    config = preset("gpt2")
    full = ledger(config, seq=1024)
    causal = ledger(config, seq=1024, attention_flops="causal")
    pick = lambda lg: sum(op.matmul_flops for op in lg.ops if op.kind in ("scores", "context"))
    assert pick(causal) * 1024 * 1024 == pick(full) * (1024 * 1025 // 2)
    other = lambda lg: lg.flops["matmul"] - pick(lg)
    assert other(causal) == other(full)
    # A bidirectional encoder and a decode step have no masked pairs to drop.
    bert = preset("bert-base")
    assert ledger(bert, seq=128, attention_flops="causal").flops["matmul"] == ledger(bert, seq=128).flops["matmul"]
    assert ledger(config, phase="decode", seq=100, attention_flops="causal").flops == ledger(config, phase="decode", seq=100).flops


def test_checkpointing_recomputes_each_layer_once():
    config = preset("gpt2")
    plain = ledger(config, phase="train", seq=256)
    ckpt = ledger(config, phase="train", seq=256, checkpointing=True)
    layer_fwd = sum(op.matmul_flops for op in plain.select(phase="forward") if op.layer is not None)
    assert ckpt.flops["matmul"] == plain.flops["matmul"] + layer_fwd
    # Checkpointing keeps each layer's input (rows x d) and rebuilds one layer's activations at a time.
    layers = [row["bytes"] for row in plain.memory["activations_per_layer"]]
    outside = plain.memory["activations"] - sum(layers)
    assert ckpt.memory["activations"] == 12 * 256 * 768 * 4 + max(layers) + outside
    assert ckpt.memory["activations"] < plain.memory["activations"]


def test_decode_cost_is_linear_in_context():
    """One decode step: O(b·d²) for the weights plus O(b·n·d) for attention over n cached tokens."""
    config = preset("gpt2")
    rows = S.decode_curve(config, [10, 11, 500], batch=4)
    step = rows[1]["flops_matmul"] - rows[0]["flops_matmul"]
    assert step == 4 * (2 + 2) * config.n_layers * config.n_heads * config.head_dim  # QK^T and AV, one more key
    assert rows[2]["flops_matmul"] - rows[0]["flops_matmul"] == 490 * step
    assert rows[1]["kv_cache"] - rows[0]["kv_cache"] == 4 * 2 * 12 * 768 * 2  # fp16, one more token, batch 4


def test_prefill_equals_forward_flops_and_writes_the_cache():
    config = preset("llama-7b")
    pre, fwd = ledger(config, phase="prefill", seq=300, dtype="fp16"), ledger(config, phase="forward", seq=300, dtype="fp16")
    assert pre.flops == fwd.flops and fwd.memory["kv_cache"] == 0 and pre.memory["kv_cache"] == 300 * 524_288


def test_rule_of_thumb_beside_exact():
    lg = ledger(preset("llama-7b"), phase="train", seq=512)
    r = lg.rules_of_thumb
    assert r["value"] == 6 * lg.params["non_embedding"] * 512
    assert r["exact_matmul"] == lg.flops["matmul"]
    assert r["attention_score_flops"] + r["weight_matmul_flops"] == r["exact_matmul"]
    assert 1.0 < r["ratio_exact_over_rule"] < 1.1


# Memory -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,per_param", [
    (dict(dtype="fp32", optimizer="adam"), 16),
    (dict(dtype="fp32", optimizer="adamw"), 16),
    (dict(dtype="fp32", optimizer="momentum"), 12),
    (dict(dtype="fp32", optimizer="sgd"), 8),
    (dict(dtype="bf16", optimizer="adam", mixed_precision=True), 16),
    (dict(dtype="fp16", optimizer="adam", mixed_precision=True, fp32_grads=True), 18),
    (dict(dtype="bf16", optimizer="adam"), 8),  # pure bf16: weights, grads, two moments, 2 B each
])
def test_training_state_per_parameter(kw, per_param):
    lg = ledger(preset("char-small"), phase="train", seq=16, **kw)
    m = lg.memory
    assert m["weights"] + m["gradients"] + m["optimizer"] == per_param * lg.params["total"]


def test_int8_is_weights_only():
    config = preset("llama-7b")
    lg = ledger(config, phase="prefill", seq=10, dtype="int8")
    assert lg.memory["weights"] == lg.params["total"]
    assert lg.memory["kv_cache"] == 10 * 524_288  # the cache stays fp16
    with pytest.raises(TformerError):
        Workload(phase="train", dtype="int8")


def test_activations_match_korthikanti_for_a_gpt_layer():
    """34·s·b·h + 5·a·s²·b bytes per layer (16-bit, dropout on, d_ff = 4h), per Korthikanti et al. 2022."""
    config = preset("gpt2")  # dropout 0.1 on attention and residuals
    s, b, h, a = 512, 4, config.d_model, config.n_heads
    lg = ledger(config, phase="train", batch=b, seq=s, dtype="bf16", mixed_precision=True)
    per_layer = {row["bytes"] for row in lg.memory["activations_per_layer"]}
    assert per_layer == {s * b * h * 34 + 5 * a * s * s * b}
    no_dropout = ledger(config.replace(dropout=0.0, attention_dropout=0.0), phase="train", batch=b, seq=s, dtype="bf16")
    assert {r["bytes"] for r in no_dropout.memory["activations_per_layer"]} == {s * b * h * 32 + 2 * a * s * s * b}
    fused = ledger(config, phase="train", batch=b, seq=s, dtype="bf16", materialize_scores=False)
    # A fused kernel keeps an fp32 log-sum-exp per query row instead of the s x s tensors.
    assert {r["bytes"] for r in fused.memory["activations_per_layer"]} == {s * b * h * 34 + 4 * a * s * b}


def test_memory_totals_are_sums():
    lg = ledger(preset("gpt2"), phase="train", batch=2, seq=128)
    m = lg.memory
    assert m["total"] == m["weights"] + m["gradients"] + m["optimizer"] + m["activations"] + m["logits"]
    assert m["logits"] == 2 * 128 * 50257 * 4
    inf = ledger(preset("gpt2"), phase="decode", batch=2, seq=128).memory
    assert inf["total"] == inf["weights"] + inf["kv_cache"] + inf["activations"] + inf["logits"]


# Roofline ----------------------------------------------------------------------------------------------------------
def test_roofline_times_and_bounds():
    lg = ledger(preset("llama-7b"), phase="decode", seq=512, dtype="fp16")
    r = roofline(lg, A100)
    assert r.ridge_point == 312e12 / 2.039e12
    assert {o.bound for o in r.ops if o.kind in ("qkv_proj", "ffn_up", "lm_head")} == {"memory"}  # decode at batch 1
    for op, t in zip(lg.ops, r.ops):
        assert t.time_s == max(op.flops / 312e12, op.bytes / 2.039e12)
    assert r.time_s == sum(t.time_s for t in r.ops)
    assert roofline(lg, A100, efficiency=0.5).time_s == pytest.approx(2 * r.time_s)
    big = roofline(ledger(preset("llama-7b"), phase="prefill", batch=8, seq=2048, dtype="fp16"), A100)
    assert next(o for o in big.ops if o.name == "decoder.layers.0.mlp.up").bound == "compute"


def test_unknown_device_is_unknown_never_guessed():
    lg = ledger(preset("gpt2"), seq=64)
    r = roofline(lg, Device("mystery", "custom", {}, bandwidth=1e12))
    assert r.time_s == "unknown" and r.peak_flops == "unknown" and {o.bound for o in r.ops} == {"unknown"}
    r = roofline(lg, Device("no-bw", "custom", {"fp32": 1e13}))
    assert r.time_s == "unknown" and r.ridge_point == "unknown"


# Scaling --------------------------------------------------------------------------------------------------------------
def test_what_if_doubling():
    config = preset("gpt2")
    w = Workload(phase="prefill", batch=2, seq=256, dtype="fp16")
    out = S.what_if(config, w, 2, device=A100)
    rows = {r["knob"]: r for r in out["rows"]}
    assert rows["batch"]["ratios"]["flops"] == 2 and rows["batch"]["ratios"]["kv_cache"] == 2
    assert rows["batch"]["ratios"]["params"] == 1
    assert rows["seq"]["ratios"]["kv_cache"] == 2 and rows["seq"]["ratios"]["flops"] > 2  # the s² term
    assert rows["n_layers"]["ratios"]["kv_cache"] == 2 and 1 < rows["n_layers"]["ratios"]["params"] < 2
    assert 3 < rows["d_model"]["ratios"]["params"] < 4  # d² layers, d-linear embeddings
    assert all(isinstance(r["ratios"]["time_s"], float) for r in out["rows"])


def test_attention_crossover():
    config = preset("gpt2")  # MHA, d_ff = 4d: QK^T+AV (4·s·d per token) meets the FFN (16·d²) at s = 4d
    x = S.attention_crossover(config)
    assert x["vs_ffn"] == 4 * config.d_model and x["vs_projections"] == 2 * config.d_model
    gqa = S.attention_crossover(preset("llama-70b"))  # fewer K/V projections move the second crossover down
    assert gqa["vs_projections"] < 2 * 8192


def test_decode_compute_bound_batch_is_where_intensity_crosses_the_ridge():
    config = preset("llama-7b")
    res = S.decode_compute_bound_batch(config, 128, A100, "fp16")
    b = res["batch"]

    def intensity(batch):
        lg = ledger(config, phase="decode", batch=batch, seq=129, context=128, dtype="fp16")
        ops = lg.select(phase="forward")
        return sum(o.flops for o in ops) / sum(o.bytes for o in ops)

    ridge = 312e12 / 2.039e12
    assert intensity(b) >= ridge > intensity(b - 1)
    # At long context the KV-cache reads grow as fast as the FLOPs: no batch is compute-bound.
    assert S.decode_compute_bound_batch(config, 2047, A100, "fp16")["batch"] is None or \
        S.decode_compute_bound_batch(config, 2047, A100, "fp16")["batch"] > b


def test_training_run_time_and_cost():
    config = preset("char-small")
    step = ledger(config, phase="train", batch=8, seq=128)
    run = S.training_run(config, tokens=8 * 128 * 1000, devices=4, utilization=0.5, peak_flops=1e14, batch=8, seq=128,
                         price_per_device_hour=2.0)
    assert run["flops"] == pytest.approx(1000 * step.flops["matmul"])
    assert run["seconds"] == pytest.approx(run["flops"] / (4 * 0.5 * 1e14))
    assert run["cost"] == pytest.approx(run["seconds"] * 4 / 3600 * 2.0)


def test_compute_optimal_sizes():
    C = 5.76e23
    chin = S.chinchilla_optimal(C)
    assert 6 * chin["params"] * chin["tokens"] == pytest.approx(C) and chin["tokens"] == pytest.approx(20 * chin["params"])
    fit = S.chinchilla_optimal_fit(C)
    assert 6 * fit["params"] * fit["tokens"] == pytest.approx(C)
    f = S.CHINCHILLA_FIT
    loss = lambda n: f["E"] + f["A"] / n ** f["alpha"] + f["B"] / (C / 6 / n) ** f["beta"]
    assert loss(fit["params"]) < min(loss(fit["params"] * 1.1), loss(fit["params"] / 1.1))
    assert S.kaplan_optimal(S.PF_DAY)["params"] == pytest.approx(1.3e9)  # 1 PF-day -> 1.3e9 (Kaplan et al. 2020)
    assert S.kaplan_optimal(1e3 * S.PF_DAY)["params"] == pytest.approx(1.3e9 * 1e3 ** 0.73)


# Bad input ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(batch=0), dict(seq=-1), dict(phase="sample"), dict(dtype="fp8"), dict(optimizer="lion"),
                                dict(attention_flops="half"), dict(context=-3), dict(mixed_precision=True, dtype="fp32")])
def test_bad_workload(kw):
    with pytest.raises(TformerError):
        Workload(**kw)


def test_impossible_workloads():
    with pytest.raises(TformerError, match="max_positions"):
        ledger(preset("gpt2"), seq=2048)
    with pytest.raises(TformerError, match="max_positions"):
        ledger(preset("gpt2"), phase="decode", seq=10, context=1024)
    with pytest.raises(TformerError, match="encoder"):
        ledger(preset("bert-base"), phase="decode", seq=10)
    ledger(preset("llama-7b"), seq=8192)  # RoPE has no table: any length is arithmetic
    with pytest.raises(TformerError):
        S.what_if(preset("gpt2"), Workload(seq=16), factor=1.3)


def test_workload_replace_is_validated():
    with pytest.raises(TformerError):
        replace(Workload(), batch=0)
