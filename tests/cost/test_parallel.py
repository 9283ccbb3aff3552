"""Beyond one device: the ledger's layouts against the ZeRO paper, Korthikanti et al.'s tensor-parallel
activations, the real model's parameters cut the way Megatron-LM and FSDP2 cut them, and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.cost import parallel as P
from tformer.cost import placement
from tformer.cost.layout import parse_zero
from tformer.cost.ledger import Workload, ledger
from tformer.model import build

GB = 1e9


def test_zero_paper_per_device_figures_for_its_7_5b_example():
    """Rajbhandari et al. 2020, Figure 1: 7.5B parameters, 64 devices, mixed-precision Adam (K = 12)."""
    published = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in published.items():
        assert round(P.zero_model_state_bytes(7.5e9, 64, stage) / GB, 1) == gb


def _odd_config(**over):
    # Odd sizes so that every ceil in the splits matters: 3 heads, vocab 67, d_ff 201.
    base = preset("char-small").with_overrides(["d_model=72", "n_heads=3", "d_ff=201", "vocab_size=67",
                                                "n_layers=5", "max_positions=32"])
    return base.replace(**over) if over else base


MEGATRON_COLUMN = ("q_proj", "k_proj", "v_proj", "up", "gate")
MEGATRON_ROW = ("o_proj", "down")


def _megatron_rank0(model, tp: int) -> int:
    """Elements rank 0 holds when the real model's tensors are cut with torch.chunk, by module name."""
    total = 0
    for name, p in model.named_parameters():
        module, _, kind = name.rpartition(".")
        leaf = module.rpartition(".")[2]
        if leaf in MEGATRON_COLUMN or name == "tok_embed.weight":
            piece = torch.chunk(p, tp, dim=0)[0]
        elif leaf in MEGATRON_ROW and kind == "weight":
            piece = torch.chunk(p, tp, dim=1)[0]
        else:
            piece = p
        total += piece.numel()
    return total


@pytest.mark.parametrize("tp", [1, 3])
@pytest.mark.parametrize("tied", [True, False])
def test_tensor_parallel_parameters_equal_the_real_model_cut_by_name(tp, tied):
    config = _odd_config(tied_embeddings=tied)
    model = build(config)
    if not tied:  # an untied head is vocabulary-parallel too
        expected = _megatron_rank0(model, tp) - model.lm_head.weight.numel() + torch.chunk(
            model.lm_head.weight, tp, dim=0)[0].numel()
    else:
        expected = _megatron_rank0(model, tp)
    held = placement.stage_parameters(config, tp=tp, pp=1)[0]
    assert placement.sharded_elements([s for _, s in held], 1) == expected


def test_pipeline_stages_cover_every_parameter_once_plus_the_tied_copy():
    config = _odd_config()  # 5 layers, tied head
    model = build(config)
    total = sum(p.numel() for p in model.parameters())
    stages = placement.stage_parameters(config, pp=2)
    sizes = [placement.sharded_elements([s for _, s in st], 1) for st in stages]
    table = model.tok_embed.weight.numel()
    assert sum(sizes) == total + table  # the last stage's own copy of the tied table
    names = [[n for n, _ in st] for st in stages]
    assert sum(".layers.2." in n for n in names[0]) and not any(".layers.3." in n for n in names[0])  # 3 + 2 layers
    assert any(n.endswith("(tied copy)") for n in names[1])
    untied = _odd_config(tied_embeddings=False)
    assert sum(placement.sharded_elements([s for _, s in st], 1) for st in placement.stage_parameters(untied, pp=5)) == sum(
        p.numel() for p in build(untied).parameters())


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_shards_follow_fsdp2s_dim0_chunks(stage):
    """Rank 0 of 4 holds torch.chunk(p, 4)[0] of each sharded state (FSDP2's per-parameter sharding)."""
    config = _odd_config()
    model = build(config)
    w = Workload(phase="train", batch=2, seq=16)  # fp32 AdamW: 4 B weights, 4 B gradients, 8 B moments
    mem = P.per_device(config, w, P.Layout(devices=4, zero=stage))
    whole = sum(p.numel() for p in model.parameters())
    chunk = sum(torch.chunk(p, 4, dim=0)[0].numel() for p in model.parameters())
    assert mem["weights"] == 4 * (chunk if stage >= 3 else whole)
    # fp32 has no master copy, so FSDP2's shard_grad_op keeps its own shard beside the gathered weights;
    # ZeRO-3 gathers one layer whole while it runs.
    assert mem["kept_shard"] == (4 * chunk if stage == 2 else 0)
    layer = sum(p.numel() for p in model.decoder.layers[0].parameters())
    assert mem["gathered_layer"] == (4 * layer if stage == 3 else 0)
    assert mem["total"] == sum(mem[k] for k in ("weights", "kept_shard", "gathered_layer", "gradients", "optimizer",
                                                "activations", "logits", "kv_cache"))
    assert mem["gradients"] == 4 * (chunk if stage >= 2 else whole)
    assert mem["optimizer"] == 8 * (chunk if stage >= 1 else whole)


@pytest.mark.parametrize("name", ["gpt2", "bert-base", "t5-small"])
@pytest.mark.parametrize("phase, checkpointing", [("train", False), ("train", True), ("forward", False)])
def test_one_device_is_the_ledgers_own_memory(name, phase, checkpointing):
    """The layout of one device must give what the single-device ledger already says, part by part,
    pre-LN (GPT-2), post-LN (BERT) and encoder-decoder (T5), with and without checkpointing."""
    config = preset(name)
    w = Workload(phase=phase, batch=2, seq=64, checkpointing=checkpointing)
    mine = P.per_device(config, w, P.Layout())
    theirs = ledger(config, w).memory
    for key in ("weights", "gradients", "optimizer", "activations", "logits", "kv_cache", "total"):
        assert mine[key] == theirs[key], key


def _one_layer_activations(tp: int, sp: bool, layers: int) -> int:
    config = preset("gpt2").replace(n_layers=layers)  # dropout 0.1 on attention and residuals, d_ff = 4h
    w = Workload(phase="train", batch=2, seq=64, dtype="bf16", mixed_precision=True)
    return P.per_device(config, w, P.Layout(devices=tp, tp=tp, sequence_parallel=sp))["activations"]


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_activations_follow_korthikanti(tp):
    """Per layer, 16-bit, dropout on: 10sbh + (24sbh + 5as²b)/t; with sequence parallelism (34sbh + 5as²b)/t
    (Korthikanti et al. 2022, section 4.2). One layer's share is the difference between 2 and 1 layers."""
    s, b, h, a = 64, 2, 768, 12
    layer = _one_layer_activations(tp, False, 2) - _one_layer_activations(tp, False, 1)
    assert layer == 10 * s * b * h + (24 * s * b * h + 5 * a * s * s * b) // tp
    layer_sp = _one_layer_activations(tp, True, 2) - _one_layer_activations(tp, True, 1)
    assert layer_sp == (34 * s * b * h + 5 * a * s * s * b) // tp


def test_pipeline_activations_hold_the_micro_batches_in_flight():
    config = _odd_config()
    w = Workload(phase="train", batch=8, seq=16)
    one = P.per_device(config, w, P.Layout(devices=1))["stages"][0]
    mem = P.per_device(config, w, P.Layout(devices=2, pp=2, micro_batches=4))
    first, last = mem["stages"]
    # Stage 0 holds 2 micro-batches of 2 sequences in flight (1F1B: P - s), stage 1 one: 3 of 5 layers
    # and the embeddings at a quarter of the batch, twice, against all of it once.
    assert first["activations"] < one["activations"]
    assert P.in_flight(P.Layout(devices=2, pp=2, micro_batches=4), 0) == 2
    assert P.in_flight(P.Layout(devices=2, pp=2, micro_batches=4), 1) == 1
    assert last["logits"] > 0 and first["logits"] == 0
    assert P.bubble_fraction(2, 4) == pytest.approx(1 / 5)
    assert P.bubble_fraction(1, 1) == 0


def test_traffic_per_device():
    config = _odd_config()
    model = build(config)
    n = sum(p.numel() for p in model.parameters())
    w = Workload(phase="train", batch=2, seq=16)
    dp = P.communication(config, w, P.Layout(devices=4))["bytes"]
    assert dp == {"data_parallel_all_reduce": round(2 * 3 / 4 * n * 4)}
    # Sharded collectives send 3 of 4 padded pieces (rank 0's torch.chunk), once each way for ZeRO-2 and with a
    # second all-gather for ZeRO-3: the ZeRO paper's 2Ψ and 3Ψ, up to the padding.
    piece = sum(torch.chunk(p, 4, dim=0)[0].numel() for p in model.parameters()) * 4
    z3 = P.communication(config, w, P.Layout(devices=4, zero=3))["bytes"]
    assert z3 == {"zero_reduce_scatter": 3 * piece, "zero_all_gather": 2 * 3 * piece}
    assert sum(z3.values()) == pytest.approx(1.5 * dp["data_parallel_all_reduce"], rel=0.01)
    z2 = P.communication(config, w, P.Layout(devices=4, zero=2))["bytes"]
    assert sum(z2.values()) == pytest.approx(dp["data_parallel_all_reduce"], rel=0.01)
    tp = P.communication(config, w, P.Layout(devices=3, tp=3))
    act = 2 * 16 * 72 * 4  # rows x d x fp32
    blocks = 2 * 5  # attention + MLP per layer, one all-reduce forward and one backward each, + the embedding's
    assert tp["bytes"] == {"tensor_parallel_all_reduce": round(2 * 2 / 3 * act * (blocks * 2 + 1))}
    pp = P.communication(config, w, P.Layout(devices=2, pp=2, micro_batches=2), link_bandwidth=1e9)
    # one replica, so no data-parallel traffic; 2 micro-batches of 1 sequence, activations out and gradients back
    assert pp["bytes"] == {"pipeline_send": (act // 2) * 2 * 2}
    assert pp["seconds"] == pytest.approx(pp["total_bytes"] / 1e9)


def test_collective_calls_and_the_alpha_beta_time():
    """Seconds = bytes / bandwidth + calls x latency; calls as DDP buckets and FSDP wraps them."""
    assert [P.ddp_buckets(b) for b in (4, 1 << 20, (1 << 20) + 1, 26 << 20, (26 << 20) + 1)] == [1, 1, 2, 2, 3]
    config = _odd_config()  # 5 layers, tied
    w = Workload(phase="train", batch=4, seq=16)
    bw, lat = 2e9, 30e-6
    cases = {P.Layout(devices=4): {"data_parallel_all_reduce": 1},
             P.Layout(devices=4, zero=3): {"zero_reduce_scatter": 6, "zero_all_gather": 12},
             P.Layout(devices=4, zero=1): {"zero_reduce_scatter": 6, "zero_all_gather": 6},
             # 3 stages of 2, 2, 1 layers: the fullest has 2 layers + its root unit
             P.Layout(devices=6, zero=2, pp=3, micro_batches=2): {"zero_reduce_scatter": 3, "zero_all_gather": 3,
                                                                  "pipeline_send": 4},
             P.Layout(devices=3, tp=3, pp=1): {"tensor_parallel_all_reduce": 2 * 5 * 2 + 1}}
    for layout, calls in cases.items():
        c = P.communication(config, w, layout, bw, link_latency=lat)
        assert c["calls"] == calls, layout
        assert c["seconds"] == pytest.approx(c["total_bytes"] / bw + sum(calls.values()) * lat)
    assert P.communication(config, w, P.Layout(devices=4), bw)["seconds"] == pytest.approx(
        P.communication(config, w, P.Layout(devices=4))["total_bytes"] / bw)  # no latency given: bytes only


@pytest.mark.parametrize("layout, words", [
    ({"devices": 3, "tp": 2}, "not divisible by --tp x --pp"),
    ({"devices": 6, "pp": 6}, "more than the model's 5 layers"),
    ({"devices": 2, "tp": 2}, "3 heads are not divisible by --tp 2"),
    ({"devices": 2, "pp": 2, "micro_batches": 0}, "--micro-batches must be a whole number"),
    ({"devices": 2, "zero": 4}, "not a ZeRO stage"),
    ({"devices": 0}, "--devices must be a whole number"),
    ({"devices": 2, "pp": 2, "micro_batches": 3}, "not divisible by --micro-batches 3"),
    ({"devices": 2, "micro_batches": 2}, "give --pp 2 or more"),
    ({"devices": 1, "sequence_parallel": True}, "give --tp 2 or more"),
])
def test_impossible_layouts_are_one_line_errors(layout, words):
    with pytest.raises(TformerError) as e:
        P.Layout(**layout).check(_odd_config(), Workload(phase="train", batch=4, seq=16))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_zero_names_and_inference_without_zero():
    assert [parse_zero(x) for x in ("0", "1", "2", "3", "no_shard", "shard_grad_op", "FULL_SHARD")] == [0, 1, 2, 3, 0, 2, 3]
    for bad in ("4", "zero3", "", "-1"):
        with pytest.raises(TformerError):
            parse_zero(bad)
    with pytest.raises(TformerError, match="drop --zero"):
        P.Layout(devices=2, zero=3).check(_odd_config(), Workload(phase="prefill", seq=16))


def test_devices_needed_is_the_smallest_that_fits():
    config = preset("llama-70b")
    w = Workload(phase="decode", batch=1, seq=2049, context=2048, dtype="bf16")
    need = P.devices_needed(config, w, 80 * 2**30)
    assert need["devices"] == 2  # 140 GB of bf16 weights do not fit one 80 GiB device; two halves do
    assert need["per_device_total"] <= 80 * 2**30
    assert P.per_device(config, w, P.Layout(devices=1))["total"] > 80 * 2**30
    train = Workload(phase="train", batch=1, seq=128, dtype="bf16", mixed_precision=True, checkpointing=True)
    small, big = (P.devices_needed(preset("gpt2"), train, m, zero=3)["devices"] for m in (0.5e9, 4e9))
    assert small > big >= 1
    # Micro-batches only matter to a pipeline: a batch they do not divide still fits without one.
    assert P.devices_needed(preset("gpt2"), train, 4e9, zero=3, micro_batches=4)["devices"] == big
    none = P.devices_needed(preset("gpt2"), Workload(phase="train", batch=64, seq=1024), 1e6, zero=3)
    assert none["devices"] is None and "activations" in none["reason"]


def _tformer(*args):
    return subprocess.run([sys.executable, "-m", "tformer", *args], capture_output=True, text=True, timeout=120, check=False)


def test_count_json_names_and_errors():
    r = _tformer("count", "--preset", "gpt2", "--phase", "train", "--batch", "2", "--seq", "128", "--devices", "8",
                 "--tp", "2", "--zero", "shard_grad_op", "--hardware", "h100-sxm", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["memory"]["per_device"]) >= {"weights", "gradients", "optimizer", "activations", "total"}
    assert out["layout"]["data_parallel"] == 4 and out["layout"]["zero"] == 2
    assert out["communication"]["link_bandwidth"] == 450e9 and out["communication"]["seconds"] > 0
    assert set(out["communication"]["bytes"]) == {"zero_reduce_scatter", "zero_all_gather", "tensor_parallel_all_reduce"}
    assert out["pipeline"]["bubble_fraction"] == 0
    assert out["devices_needed"]["devices"] >= 1
    bad = _tformer("count", "--preset", "gpt2", "--phase", "train", "--devices", "3", "--tp", "2")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "divisible" in bad.stderr
    bad = _tformer("count", "--preset", "gpt2", "--phase", "train", "--devices", "2", "--link-bandwidth", "fast")
    assert bad.returncode == 2 and "link" in bad.stderr and "Traceback" not in bad.stderr
    assert math.isfinite(out["parallel_time"]["overlapped_s"])
    calls = out["communication"]["calls"]
    assert calls == {"zero_reduce_scatter": 13, "zero_all_gather": 13, "tensor_parallel_all_reduce": 2 * 2 * 12 + 1}
    slow = _tformer("count", "--preset", "gpt2", "--phase", "train", "--batch", "2", "--seq", "128", "--devices", "8",
                    "--tp", "2", "--zero", "shard_grad_op", "--hardware", "h100-sxm", "--link-latency", "10", "--json")
    c = json.loads(slow.stdout)["communication"]
    assert c["seconds"] == pytest.approx(out["communication"]["seconds"] + sum(calls.values()) * 10e-6)


def test_gpipe_holds_every_micro_batch_and_1f1b_at_most_the_stages():
    config = _odd_config()  # 5 layers
    w = Workload(phase="train", batch=8, seq=16)
    one = P.per_device(config, w, P.Layout(devices=2, pp=2, micro_batches=8))["stages"][0]
    gpipe = P.per_device(config, w, P.Layout(devices=2, pp=2, micro_batches=8, schedule="gpipe"))["stages"][0]
    assert gpipe["activations"] == 4 * one["activations"] > 0  # stage 0 of 2: 8 micro-batches in flight, not 2
    r = _tformer("count", "--preset", "gpt2", "--phase", "train", "--batch", "8", "--seq", "64", "--devices", "4",
                 "--pp", "4", "--micro-batches", "8", "--schedule", "gpipe", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["layout"]["schedule"] == "gpipe" and "gpipe" in out["layout"]["text"]


def test_a_pipeline_boundary_in_the_decoder_also_carries_the_encoders_output():
    """T5 with 3 + 3 layers: cut after the encoder, the boundary sends the encoder's output (16 tokens);
    cut inside the decoder, it sends the decoder's states (8 tokens) and the encoder's output its later
    layers' cross-attention reads (16 tokens). A decode step does not run the encoder: 1 token."""
    config = preset("t5-small").with_overrides(["n_layers=3", "n_decoder_layers=3", "d_model=24", "n_heads=2",
                                                "d_ff=40", "vocab_size=50"])
    w = Workload(phase="train", batch=2, seq=16, seq_decoder=8)
    per_token = 2 * 24 * 4 * 2  # sequences x d x fp32 x (forward + backward)
    assert P.communication(config, w, P.Layout(devices=2, pp=2))["bytes"]["pipeline_send"] == 16 * per_token
    assert P.communication(config, w, P.Layout(devices=3, pp=3))["bytes"]["pipeline_send"] == (8 + 16) * per_token
    dec = Workload(phase="decode", batch=2, seq=16, context=5)
    assert P.communication(config, dec, P.Layout(devices=3, pp=3))["bytes"]["pipeline_send"] == 1 * 2 * 24 * 4
