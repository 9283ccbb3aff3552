"""The chunked LM loss (tformer.model.chunked_loss): the plain path's loss and every gradient within 1e-5, with one
chunk of logits in memory at a time; the FLOPs and bytes the ledger charges for it are what it runs and allocates;
what cannot be chunked is refused in one line."""

import pytest
import torch
import torch.nn.functional as F

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.data.batch import Batch, example_batch
from tformer.measure.flops import FlopCounter
from tformer.measure.memory_peak import PeakTensorMemory
from tformer.model import build
from tformer.model.base import IGNORE_INDEX
from tformer.model.chunked_loss import chunked_lm_loss
from tformer.model.runners import runner_for

TOL = 1e-5


def tiny(tied=False, **kw):
    fields = {"arch": "decoder", "n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "d_ff": 64,
              "vocab_size": 97, "max_positions": 32, "tied_embeddings": tied, "dropout": 0.0}
    torch.manual_seed(0)
    return build(ModelConfig(**{**fields, **kw}))


def lm_batch(V=97, B=3, T=20):
    """Next-token targets, with ignored positions: each row's last, and the first five of row 0 (a prompt)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = ids.roll(-1, 1)
    targets[:, -1] = IGNORE_INDEX
    targets[0, :5] = IGNORE_INDEX
    return Batch({"input_ids": ids}, targets)


def step(model, batch, chunk, **loss_kw):
    """(loss, {name: gradient}) of one runner.loss + backward, the logits ``chunk`` rows at a time (0: whole)."""
    runner = runner_for(model)
    model.zero_grad(set_to_none=True)
    loss = runner.loss(batch, chunk=chunk, **loss_kw)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("eps, softcap", [(0.0, None), (0.1, None), (0.0, 5.0), (0.1, 5.0)])
def test_function_equals_cross_entropy_on_the_whole_logits(chunk, bias, eps, softcap):
    torch.manual_seed(0)
    N, d, V = 37, 16, 101
    h = torch.randn(N, d, requires_grad=True)
    W = torch.randn(V, d, requires_grad=True)
    b = torch.randn(V, requires_grad=True) if bias else None
    y = torch.randint(0, V, (N,))
    y[::5] = IGNORE_INDEX
    leaves = [h, W] + ([b] if bias else [])

    z = F.linear(h, W, b)
    z = softcap * torch.tanh(z / softcap) if softcap else z
    plain = F.cross_entropy(z.float(), y, ignore_index=IGNORE_INDEX, label_smoothing=eps)
    want = torch.autograd.grad(plain, leaves)
    chunked = chunked_lm_loss(h, W, y, chunk, b, label_smoothing=eps, softcap=softcap)
    got = torch.autograd.grad(chunked, leaves)
    assert abs(chunked.item() - plain.item()) < TOL
    for g, w in zip(got, want):
        assert (g - w).abs().max() < TOL


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_runner_loss_and_every_gradient_equal_the_plain_path(tied, eps):
    """End to end through a tiny decoder: the head weight (tied to the embedding or not) and everything upstream."""
    model, batch = tiny(tied), lm_batch()
    plain_loss, plain = step(model, batch, 0, label_smoothing=eps)
    loss, grads = step(model, batch, 7, label_smoothing=eps)
    assert abs(loss.item() - plain_loss.item()) < TOL
    assert grads.keys() == plain.keys()
    assert tied or "lm_head.weight" in grads  # a tied head's gradient lands in tok_embed.weight
    for name, g in plain.items():
        assert (grads[name] - g).abs().max() < TOL, name


def test_a_softcapped_head_equals_the_plain_path():
    model, batch = tiny(logit_softcap=3.0), lm_batch()
    plain_loss, plain = step(model, batch, 0)
    loss, grads = step(model, batch, 16)
    assert abs(loss.item() - plain_loss.item()) < TOL
    for name, g in plain.items():
        assert (grads[name] - g).abs().max() < TOL, name


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_bf16_autocast_computes_the_head_in_bf16_as_the_plain_path_does(softcap):
    """Under autocast both paths run the head's matmuls in bf16 and the softmax in fp32: they agree to bf16's
    rounding (the plain path sums the weight's gradient in one bf16 matmul, the chunked one in fp32 chunk by chunk)."""
    model, batch = tiny(True, logit_softcap=softcap), lm_batch()
    plain_loss, plain = step(model, batch, 0, autocast=torch.autocast("cpu", dtype=torch.bfloat16))
    loss, grads = step(model, batch, 7, autocast=torch.autocast("cpu", dtype=torch.bfloat16))
    assert abs(loss.item() - plain_loss.item()) < 1e-3
    largest = max(g.abs().max().item() for g in plain.values())
    for name, g in plain.items():
        assert (grads[name] - g).abs().max() < 1e-2 * largest, name


def test_evaluation_without_gradients_gives_the_same_loss():
    model, batch = tiny(), lm_batch()
    runner = runner_for(model)
    with torch.no_grad():
        plain = runner.loss(batch)
        chunked = runner.loss(batch, chunk=5)
        scored = runner.scored(batch, chunk=5)  # evaluation's call: the same chunked loss, no answers counted
    assert scored.loss.item() == chunked.item() and scored.rows == 0
    assert abs(chunked.item() - plain.item()) < TOL


def test_the_backward_recomputes_the_head_once_as_the_ledger_counts():
    """Measured FLOPs (FlopCounterMode) of a chunked step exceed the plain step's by exactly the head's forward
    matmul, 2 x rows x d x V, the ledger's recompute row."""
    model = tiny()
    runner, config = runner_for(model), model.config
    batch = example_batch(config, torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0)))
    measured = {}
    for chunk in (0, 7):
        with FlopCounter() as fc:
            runner.loss(batch, chunk=chunk).backward()
        measured[chunk] = fc.get_total_flops()
    plain, chunked = (ledger(config, Workload(phase="train", batch=2, seq=16, loss_chunk=c)) for c in (0, 7))
    head = 2 * 2 * 16 * 32 * 97
    assert measured[7] - measured[0] == chunked.flops["matmul"] - plain.flops["matmul"] == head
    assert [op.name for op in chunked.select(phase="recompute")] == ["lm_head"]


@pytest.mark.parametrize("softcap", [None, 10.0])
def test_one_chunk_working_set_is_what_the_ledger_charges(softcap):
    """The peak tensor bytes of the chunked loss's forward + backward on given hidden states: the ledger's logits
    term (one chunk's working set), the two gradients it returns (W's (V, d) and h's (N, d), fp32) and O(N) small
    vectors (the per-row log-sum-exp, label slices) -- nothing of size N x V."""
    B, T, d, V, n = 2, 256, 64, 8192, 64
    config = ModelConfig(arch="decoder", n_layers=1, d_model=d, n_heads=4, d_ff=128, vocab_size=V, max_positions=T,
                         logit_softcap=softcap)
    predicted = ledger(config, Workload(phase="train", batch=B, seq=T, loss_chunk=n)).memory["logits"]
    assert predicted == n * V * (8 if softcap else 4)
    torch.manual_seed(0)
    h = torch.randn(B, T, d, requires_grad=True)
    W = torch.randn(V, d, requires_grad=True)
    y = torch.randint(0, V, (B, T))
    with PeakTensorMemory() as m:
        chunked_lm_loss(h, W, y, n, softcap=softcap).backward()
    gradients = V * d * 4 + B * T * d * 4
    assert 0 <= m.peak - (predicted + gradients) <= 64 * B * T


def test_chunked_peak_is_far_below_the_plain_peak_on_a_large_vocabulary():
    """The structural claim behind --loss-chunk: with d small and V large the (tokens x V) logits, their
    log-probabilities and their gradient dominate a training step, and chunking leaves one chunk of them."""
    model = tiny(d_model=32, vocab_size=16384, max_positions=256, n_layers=1)
    runner = runner_for(model)
    batch = example_batch(model.config, torch.randint(0, 16384, (1, 256), generator=torch.Generator().manual_seed(0)))
    peaks = {}
    for chunk in (0, 32):
        model.zero_grad(set_to_none=True)
        with PeakTensorMemory() as m:
            runner.loss(batch, chunk=chunk).backward()
        peaks[chunk] = m.peak
    logits = 256 * 16384 * 4
    assert peaks[0] >= 2 * logits
    assert peaks[32] < peaks[0] / 4


def test_what_cannot_be_chunked_is_refused_in_one_line():
    with pytest.raises(TformerError, match="decoder-only"):
        runner_for(build(ModelConfig(arch="encoder", n_layers=1, d_model=32, n_heads=4, d_ff=64, vocab_size=50,
                                     max_positions=16))).check_chunk(8)
    with pytest.raises(TformerError, match="sequence-classification head"):
        runner_for(tiny(task="sequence-classification", n_classes=2)).loss(lm_batch(), chunk=8)
    model = tiny()
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(TformerError, match="this head is a Sequential"):
        runner_for(model).check_chunk(8)
    with pytest.raises(TformerError, match="number of rows"):
        runner_for(tiny()).check_chunk(-1)
    with pytest.raises(TformerError, match="loss chunk"):
        chunked_lm_loss(torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long), 0)
    runner_for(build(ModelConfig(arch="encoder", n_layers=1, d_model=32, n_heads=4, d_ff=64, vocab_size=50,
                                 max_positions=16))).check_chunk(0)  # 0 is the plain path: every runner takes it
