"""One description of each architecture (tformer.cost.architecture), read by the model and the
ledger: its parameter names and shapes are the model's, its module paths are the ledger's row
names, and the ledger's attention rows are keyed by the model's attention kinds."""

from __future__ import annotations

import pytest

from tformer.core.config import ATTN_IMPLS, PRESETS, ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.cost.architecture import describe
from tformer.cost.attention import ATTENTION_COSTS, AttentionCall, attention_rows
from tformer.cost.ledger import Workload, ledger
from tformer.cost.ops import MatMul, Op
from tformer.cost.roofline import gemv_dims
from tformer.model import build


def _tiny(name: str) -> ModelConfig:
    """The preset's structure (arch, positions, norms, gating, ties, heads) at a size that builds in ms.
    Sizes that a preset sets apart from the default rule stay apart (T5's head_dim, GQA, deeper decoder)."""
    spec = PRESETS[name]
    small = dict(n_layers=2, d_model=32, n_heads=4, d_ff=48, vocab_size=40, max_positions=24)
    if spec.get("head_dim"):
        small["head_dim"] = 12
    if spec.get("n_kv_heads"):
        small["n_kv_heads"] = 2
    if spec["arch"] == "encoder-decoder":
        small["n_decoder_layers"] = 3
    if spec.get("layer_types"):  # Gemma 3: a sliding layer and a global one, the window inside the context
        small.update(layer_types=["sliding", "full"], attn_window=8)
    return preset(name, **small)


CASES = [(name, _tiny(name)) for name in PRESETS] + [
    ("bert-mlm", preset("bert-base", lm_head=True, n_layers=1, d_model=16, n_heads=2, d_ff=24, vocab_size=30)),
    ("bert-untied-mlm", preset("bert-base", lm_head=True, tied_embeddings=False, n_layers=1, d_model=16, n_heads=2,
                               d_ff=24, vocab_size=30)),
    ("alibi", ModelConfig(position="alibi", n_layers=1, d_model=16, n_heads=2, d_ff=24)),
    ("no-positions-untied", ModelConfig(position="none", tied_embeddings=False, n_layers=1, d_model=16, n_heads=2, d_ff=24)),
]


@pytest.mark.parametrize("name,config", CASES, ids=[n for n, _ in CASES])
def test_description_is_the_models_parameters(name, config):
    model = build(config, device="meta")
    ours = list(describe(config).parameters().items())
    theirs = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert ours == theirs  # names, shapes and registration order


# arch='rnn': one torch module holds every layer (torch's names), so its ledger rows are named by parameter
# (tests/cost/test_recurrent_ledger.py), not by module; the description still equals the model.
RNN_CASES = [
    ("rnn-lstm", ModelConfig(arch="rnn", cell="lstm", n_layers=2, d_model=15, d_hidden=22, vocab_size=30)),
    ("rnn-gru-tied", ModelConfig(arch="rnn", cell="gru", n_layers=3, d_model=14, vocab_size=30)),
    ("rnn-elman-no-bias", ModelConfig(arch="rnn", cell="rnn", n_layers=1, d_model=9, d_hidden=5, bias=False)),
]


@pytest.mark.parametrize("name,config", RNN_CASES, ids=[n for n, _ in RNN_CASES])
def test_description_is_the_rnn_models_parameters(name, config):
    test_description_is_the_models_parameters(name, config)


@pytest.mark.parametrize("name,config", CASES, ids=[n for n, _ in CASES])
def test_every_parameter_row_of_the_ledger_is_a_described_module(name, config):
    arch = describe(config)
    modules = {n.rsplit(".", 1)[0] for n in arch.parameters()}
    lg = ledger(config, Workload(phase="forward", batch=1, seq=8))
    owners = {op.name for op in lg.ops if op.params}
    assert owners <= modules
    assert sum(op.params for op in lg.ops) == sum(_numel(s) for s in arch.parameters().values())


def _numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def test_architecture_dispatch_lives_in_describe():
    arch = describe(_tiny("t5-small"))
    assert [s.name for s in arch.stacks] == ["encoder", "decoder"]
    enc, dec = arch.stacks
    assert not enc.causal and dec.causal and dec.cross and not enc.cross
    assert len(enc.layers) == 2 and len(dec.layers) == 3
    assert [a.path for a in dec.layers[0].attention] == ["decoder.layers.0.attn", "decoder.layers.0.cross_attn"]
    assert dec.layers[0].attention[0].q.parameters() == {"decoder.layers.0.attn.q_proj.weight": (48, 32)}
    assert arch.lm_head.rescale and arch.lm_head.linear.tied
    assert arch.stack("decoder") is dec
    with pytest.raises(TformerError, match="has no decoder stack"):
        describe(_tiny("bert-base")).stack("decoder")


def test_attention_cost_registry_matches_the_models_attention_kinds():
    assert set(ATTENTION_COSTS) == set(ATTN_IMPLS)


def test_attention_kind_picks_the_rows_and_unknown_kinds_are_refused():
    config = _tiny("gpt2")
    assert Workload().attention_kind == "reference"
    assert Workload(materialize_scores=False).attention_kind == "sdpa"
    ref = ledger(config, phase="train", batch=2, seq=16)
    fused = ledger(config, phase="train", batch=2, seq=16, materialize_scores=False)
    scores = [op for op in ref.select(phase="forward", kind="scores")]
    fused_scores = [op for op in fused.select(phase="forward", kind="scores")]
    assert all(op.bytes_written == 2 * 4 * 16 * 16 * 4 for op in scores)  # B H Tq Tk fp32
    assert all(op.bytes_written == 0 for op in fused_scores)
    assert ref.flops["matmul"] == fused.flops["matmul"]
    call = AttentionCall(path="x.attn", layer=0, stack="decoder", batch=1, heads=2, kv_heads=2, head_dim=4, tq=3,
                         tk=3, pairs=9, act_bytes=4, extra_flops=1, cache_bytes=0, dropout=0.0)
    assert [op.name for op in attention_rows("sdpa", call)] == ["x.attn.scores", "x.attn.softmax", "x.attn.context"]
    with pytest.raises(TformerError, match="choose one of: reference, sdpa"):
        attention_rows("flash9", call)


def test_matmul_ops_carry_dims_and_the_roofline_never_reads_the_label():
    lg = ledger(_tiny("llama-7b"), Workload(phase="decode", batch=1, context=5))
    q = next(op for op in lg.ops if op.name == "decoder.layers.0.attn.q_proj")
    assert q.dims == MatMul(1, 1, 32, 32, weight=True)
    scores = next(op for op in lg.ops if op.name == "decoder.layers.0.attn.scores")
    assert scores.dims == MatMul(4, 1, 8, 6) and gemv_dims(scores) is None
    assert q.to_dict()["dims"] == {"batch": 1, "m": 1, "k": 32, "n": 32, "weight": True}
    unlabelled = Op(name="w", kind="ffn_up", layer=0, phase="forward", shapes="", dims=MatMul(1, 4, 64, 128, True),
                    matmul_flops=2 * 4 * 64 * 128)
    assert gemv_dims(unlabelled) == (4, 64)
    label_only = Op(name="w", kind="ffn_up", layer=0, phase="forward", shapes="[4, 64] @ [64, 128]", matmul_flops=10)
    assert gemv_dims(label_only) is None


@pytest.mark.parametrize("name", ["gpt2", "bert-base", "bart-base", "llama-70b"])
def test_forward_matmul_flops_are_the_sum_of_their_dims(name):
    lg = ledger(_tiny(name), Workload(phase="forward", batch=2, seq=8, attention_flops="full"))
    for op in lg.ops:
        assert (op.dims.flops if op.dims else 0) == op.matmul_flops, op.name


def test_describe_needs_no_torch():
    import subprocess
    import sys

    code = ("import sys; from tformer.cost.architecture import describe; from tformer.core.config import preset; "
            "describe(preset('llama-70b')); from tformer.cost.ledger import ledger; ledger(preset('t5-small')); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# Weight-only quantization (config.quantize): the quantized Linears' weights are buffers, so the described
# parameters are the float ones left (biases, norms, tables), and the quantized buffers are described apart.
QUANT_CASES = [
    ("gpt2-int8", preset("gpt2", n_layers=2, d_model=64, n_heads=4, d_ff=96, vocab_size=40, max_positions=24,
                         quantize="int8")),
    ("llama-int4", preset("llama-7b", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=40,
                          max_positions=24, quantize="int4", quant_group=32)),
    ("t5-int4-g64", preset("t5-small", n_layers=1, n_decoder_layers=2, d_model=64, n_heads=4, head_dim=16, d_ff=128,
                           vocab_size=40, quantize="int4", quant_group=64)),
]


@pytest.mark.parametrize("name,config", QUANT_CASES, ids=[n for n, _ in QUANT_CASES])
def test_description_of_a_quantized_model(name, config):
    from tformer.cost.quantized import architecture_buffers

    test_description_is_the_models_parameters(name, config)
    model = build(config, device="meta")
    described = {n: (shape, dtype) for n, (shape, dtype, _) in architecture_buffers(describe(config)).items()}
    theirs = {n: (tuple(b.shape), str(b.dtype).removeprefix("torch.")) for n, b in model.named_buffers()
              if n in described}
    assert described and theirs == described
    assert "lm_head.weight" in described  # a tied head becomes its own quantized weight
