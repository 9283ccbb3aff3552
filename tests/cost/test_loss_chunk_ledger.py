"""The ledger's chunked LM loss (Workload.loss_chunk): the logits' memory becomes one chunk's working set, the loss
keeps a log-sum-exp per row instead of its log-probabilities, the backward recomputes the head's matmul; the model's
side (the bytes it allocates, the FLOPs it runs) is tests/model/test_chunked_loss.py."""

from dataclasses import replace

import pytest

from tformer.core.config import ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.cost import parallel as P
from tformer.cost.ledger import Workload, ledger
from tformer.cost.memory import vocabulary_bytes

ROWS, V, D = 2 * 256, 8192, 64


def config(**kw):
    return ModelConfig(arch="decoder", n_layers=1, d_model=D, n_heads=4, d_ff=128, vocab_size=V, max_positions=256,
                       dropout=0.0, **kw)


def pair(c, **w):
    """(the plain ledger, the one with 64-row chunks) of a training step of 2 x 256 tokens."""
    work = Workload(phase="train", batch=2, seq=256, **w)
    return ledger(c, work), ledger(c, replace(work, loss_chunk=64))


@pytest.mark.parametrize("w, a, per_logit", [({}, 4, 4), ({"dtype": "bf16", "mixed_precision": True}, 2, 6)])
def test_logits_memory_is_one_chunks_working_set(w, a, per_logit):
    """fp32: the chunk's logits, turned in place into probabilities and then their gradient (4 B a logit). bf16: the
    16-bit logits the head writes beside their fp32 copy, the 16-bit gradient beside the fp32 one (6 B)."""
    plain, chunked = pair(config(), **w)
    assert plain.memory["logits"] == ROWS * V * a
    assert chunked.memory["logits"] == 64 * V * per_logit
    # the loss keeps a log-sum-exp per row (fp32), not the rows x V log-probabilities
    assert plain.memory["activations"] - chunked.memory["activations"] == ROWS * V * 4 - ROWS * 4
    assert vocabulary_bytes(plain) == ROWS * V * (a + 4)
    assert vocabulary_bytes(chunked) == 64 * V * per_logit + ROWS * 4
    assert plain.memory["total"] - chunked.memory["total"] == vocabulary_bytes(plain) - vocabulary_bytes(chunked)


def test_a_softcap_is_recomputed_too_and_needs_a_second_buffer():
    plain, chunked = pair(config(logit_softcap=30.0))
    assert chunked.memory["logits"] == 64 * V * 8  # the fp32 logits and tanh's output, in the backward
    cap = [op for op in chunked.ops if op.name == "lm_head.softcap"]
    assert [op.phase for op in cap] == ["forward", "recompute", "backward"] and cap[0].saved_bytes == 0
    assert plain.memory["activations"] - chunked.memory["activations"] == ROWS * V * (4 + 4) - ROWS * 4


def test_the_backward_recomputes_the_heads_matmul_and_nothing_else_changes_in_flops():
    plain, chunked = pair(config())
    redone = chunked.select(phase="recompute")
    assert [op.name for op in redone] == ["lm_head"] and redone[0].matmul_flops == 2 * ROWS * D * V
    assert chunked.flops["matmul"] - plain.flops["matmul"] == 2 * ROWS * D * V
    for phase in ("forward", "backward", "optimizer"):
        assert chunked.flops["by_phase"][phase] == plain.flops["by_phase"][phase]


def test_a_chunk_larger_than_the_batch_is_the_batch():
    _, chunked = pair(config())
    huge = ledger(config(), Workload(phase="train", batch=2, seq=256, loss_chunk=10 ** 9))
    assert huge.memory["logits"] == ROWS * V * 4 and huge.memory["logits"] > chunked.memory["logits"]


def test_other_phases_are_untouched_and_other_models_refused():
    c = config()
    assert ledger(c, phase="forward", seq=64, loss_chunk=16).to_dict(False)["memory"] == \
        ledger(c, phase="forward", seq=64).to_dict(False)["memory"]
    with pytest.raises(TformerError, match="decoder-only"):
        ledger(preset("bert-base"), phase="train", seq=64, loss_chunk=16)
    with pytest.raises(TformerError, match="decoder-only"):
        ledger(preset("t5-small"), phase="train", seq=64, loss_chunk=16)
    with pytest.raises(TformerError, match="loss_chunk"):
        Workload(phase="train", loss_chunk=-1)


def test_one_device_layout_charges_the_same_chunk():
    w = Workload(phase="train", batch=2, seq=64, loss_chunk=32)
    mine = P.per_device(preset("gpt2"), w, P.Layout())
    theirs = ledger(preset("gpt2"), w).memory
    for key in ("activations", "logits", "total"):
        assert mine[key] == theirs[key], key
