"""The ledger of task-head models (config.task) against PyTorch: describe(config).parameters() is the model's
named_parameters() (names, shapes, order), params == numel, and the forward and training matmul FLOPs equal
FlopCounterMode's, for every task x encoder / decoder x pooling on hypothesis-drawn tiny configs; the training
step runs the head's own loss (cross-entropy, MSE, BCE or the two answer cross-entropies), as TaskRunner does."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tformer.core.config import ModelConfig
from tformer.cost.architecture import describe
from tformer.cost.ledger import ledger
from tformer.measure.flops import FlopCounter
from tformer.model import build

# (arch, task, pooling): every pooling for sequence classification on both stacks, the per-token tasks once each
GRID = [(arch, "sequence-classification", pooling) for arch in ("encoder", "decoder") for pooling in
        ("cls", "mean", "last")] + [(arch, task, None) for arch in ("encoder", "decoder")
                                    for task in ("token-classification", "question-answering")]


@st.composite
def head_configs(draw, arch: str, task: str, pooling: str | None):
    n_heads = draw(st.sampled_from([1, 2, 3]))
    data = dict(arch=arch, task=task, pooling=pooling, n_layers=draw(st.integers(1, 2)),
                d_model=n_heads * draw(st.sampled_from([3, 5])), n_heads=n_heads, d_ff=draw(st.integers(3, 13)),
                vocab_size=draw(st.integers(5, 31)), max_positions=12, pad_token_id=0,
                position=draw(st.sampled_from(["learned", "rope", "sinusoidal"])) if arch == "decoder" else "learned",
                norm_placement="post" if arch == "encoder" else "pre", bias=draw(st.booleans()),
                activation=draw(st.sampled_from(["gelu", "relu", "silu"])), gated_mlp=draw(st.booleans()))
    if data["position"] == "rope":
        data["d_model"] = n_heads * 4  # an even head width
    if task != "question-answering":
        data["n_classes"] = draw(st.sampled_from([1, 2, 5]))
    if arch == "encoder":
        data.update(pooler=draw(st.booleans()), type_vocab_size=draw(st.integers(0, 2)), lm_head=False)
    return ModelConfig.from_dict(data)


def _labels(config, batch: int, seq: int) -> dict:
    """The head's training labels: an answer span, a class per token, a class or a value per sequence."""
    g = torch.Generator().manual_seed(0)
    if config.task == "question-answering":
        return {"start_positions": torch.randint(0, seq, (batch,), generator=g),
                "end_positions": torch.randint(0, seq, (batch,), generator=g)}
    shape = (batch, seq) if config.task == "token-classification" else (batch,)
    if config.n_classes == 1:
        return {"labels": torch.randn(shape, generator=g)}
    return {"labels": torch.randint(0, config.n_classes, shape, generator=g)}


def counted_flops(model, config, batch: int, seq: int, train: bool) -> int:
    """FlopCounterMode's total for a forward pass (train: with the head's loss and its backward)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, config.vocab_size, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq // 2 + 1:] = 0  # one row padded on the right
    ids[mask == 0] = 0
    model.train(train)
    with torch.set_grad_enabled(train), FlopCounter() as fc:
        out = model(ids, attention_mask=mask, **(_labels(config, batch, seq) if train else {}))
        if train:
            out.loss.backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("arch,task,pooling", GRID, ids=[f"{a}-{t}-{p}" for a, t, p in GRID])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), batch=st.integers(1, 3), seq=st.integers(2, 7))
def test_task_head_ledger_equals_torch(arch, task, pooling, data, batch, seq):
    config = data.draw(head_configs(arch, task, pooling))
    torch.manual_seed(0)
    model = build(config.replace(attn_impl="reference"))
    assert list(describe(config).parameters().items()) == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert ledger(config, seq=seq).params["total"] == sum(p.numel() for p in model.parameters())
    fwd = counted_flops(model, config, batch, seq, train=False)
    assert ledger(config, phase="forward", batch=batch, seq=seq).flops["matmul"] == fwd
    train = ledger(config, phase="train", batch=batch, seq=seq)
    # 3x forward, less the backward of a pooler the head does not read (token and answer heads; mean / last)
    skips = train.architecture.loss_skips
    unreached = sum(op.matmul_flops for op in train.select(phase="forward", kind="pooler") if skips)
    assert train.flops["matmul"] == counted_flops(model, config, batch, seq, train=True) == 3 * fwd - 2 * unreached
    assert train.memory["gradients"] == 4 * sum(p.numel() for n, p in model.named_parameters()
                                                if not n.startswith(skips))


def test_the_ledger_names_the_head_and_drops_the_lm_head():
    base = ModelConfig(arch="decoder", n_layers=1, d_model=12, n_heads=2, d_ff=20, vocab_size=40)
    plain, head = ledger(base), ledger(base.replace(task="sequence-classification", n_classes=3))
    assert head.params["by_component"]["classifier"] == 12 * 3  # no bias, as GPT-2's score
    assert "lm_head" not in {op.kind for op in head.ops} and "lm_head" in {op.kind for op in plain.ops}
    answers = ledger(ModelConfig(arch="encoder", n_layers=1, d_model=12, n_heads=2, d_ff=20, vocab_size=40,
                                 task="question-answering", lm_head=False), phase="train", batch=2, seq=5)
    assert answers.params["by_component"]["classifier"] == 12 * 2 + 2
    assert {op.name for op in answers.ops if op.kind == "loss"} == {"loss.start", "loss.end"}
