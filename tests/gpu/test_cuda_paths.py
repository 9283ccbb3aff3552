"""The paths that exist only on a GPU: the compiled decode step (CUDA graphs, mode="reduce-overhead")
equals eager decoding token for token, and a bf16 autocast training step runs with a finite loss.
Skipped without CUDA; bench/gpu_check.sh runs them on an H100/H200 (docs/GPU.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tformer.core.config import ModelConfig
from tformer.generate import generate
from tformer.model import build

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]


def _model(device: torch.device):
    config = ModelConfig(arch="decoder", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=96,
                         max_positions=64, position="rope", tied_embeddings=False)
    torch.manual_seed(0)
    model = build(config).eval()
    # Larger random weights than the init: each token then depends on the context, so a wrong cache
    # position or a stale graph input changes the tokens instead of repeating the prompt's last one.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.to(device)


@pytest.fixture
def cuda_device(device) -> torch.device:
    """The session's device when it is a GPU, else the first GPU: these paths mean nothing on a CPU."""
    return device if device.type == "cuda" else torch.device("cuda")


def test_compiled_decode_with_cuda_graphs_equals_eager(cuda_device):
    model = _model(cuda_device)
    eager = generate(model, PROMPTS, max_new_tokens=12, stop_tokens=[])
    compiled = generate(model, PROMPTS, max_new_tokens=12, stop_tokens=[], compile=True)
    again = generate(model, PROMPTS, max_new_tokens=12, stop_tokens=[], compile=True)  # replays the graphs
    assert compiled.sequences == eager.sequences == again.sequences
    assert len({tuple(s) for s in eager.sequences}) > 1  # the rows really differ
    assert compiled.compile_seconds > 0 and compiled.decode_tokens_per_s > 0
    # Beam search moves rows between buffer sets (batch rows, then batch x beams) kept at fixed addresses.
    beams = dict(max_new_tokens=8, stop_tokens=[], num_beams=3)
    assert generate(model, PROMPTS, compile=True, **beams).sequences == generate(model, PROMPTS, **beams).sequences


def test_bf16_autocast_training_step_is_finite_and_learns(cuda_device):
    model = _model(cuda_device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 96, (4, 33), device=cuda_device, generator=torch.Generator(cuda_device).manual_seed(0))
    losses = []
    for _ in range(5):  # the same batch: the loss must fall
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids[:, :-1]).logits
        assert logits.dtype == torch.bfloat16  # autocast really ran the matmuls in bf16
        loss = F.cross_entropy(logits.float().reshape(-1, 96), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    assert losses[-1] < losses[0], losses
