"""ALBERT in the ledger: a shared layer's parameters count once, its FLOPs once per depth. So the
parameter saving against BERT is real (about 12M against 110M at base size), while the forward
compute is not reduced: the one layer still runs n_layers times (the "9x speedup" some texts claim
is the parameter ratio, not a compute ratio)."""

from __future__ import annotations

import pytest
import torch

from tformer.core.config import ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.measure.flops import FlopCounter
from tformer.model import build

SEQ = 128


def _matmul_flops(config, seq=SEQ) -> int:
    return ledger(config, Workload(phase="forward", batch=1, seq=seq)).flops["matmul"]


@pytest.mark.parametrize("share", [True, False])
def test_tiny_albert_params_and_flops_equal_torch(share):
    config = preset("albert-base", pooler=True, pair_head=True, n_layers=3, d_model=36, n_heads=4, d_ff=44,
                    vocab_size=97, max_positions=24, embed_dim=14, share_layers=share)
    torch.manual_seed(0)
    model = build(config).eval()
    assert ledger(config, Workload(seq=8)).params["total"] == sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad(), FlopCounter() as fc:
        model(ids)
    assert ledger(config, Workload(phase="forward", batch=2, seq=11)).flops["matmul"] == fc.get_total_flops()


def test_sharing_saves_parameters_not_flops():
    shared = preset("albert-base")
    unshared = shared.replace(share_layers=False)
    p_shared = ledger(shared, Workload(seq=SEQ)).params["total"]
    p_unshared = ledger(unshared, Workload(seq=SEQ)).params["total"]
    layer = 4 * (768 * 768 + 768) + 2 * 768 * 3072 + 3072 + 768 + 2 * 2 * 768  # q k v o, up, down, two norms
    assert p_unshared - p_shared == 11 * layer
    assert _matmul_flops(shared) == _matmul_flops(unshared)


def test_albert_base_against_bert_base():
    """Same body sizes (12 x 768, 12 heads, d_ff 3072), heads compared like for like (pooler only)."""
    albert = preset("albert-base", lm_head=False, pooler=True)
    bert = preset("bert-base")
    p_albert = ledger(albert, Workload(seq=SEQ)).params["total"]
    p_bert = ledger(bert, Workload(seq=SEQ)).params["total"]
    print(f"params: albert-base {p_albert / 1e6:.1f}M, bert-base {p_bert / 1e6:.1f}M ({p_bert / p_albert:.1f}x)")
    assert 11e6 < p_albert < 13e6 and 105e6 < p_bert < 115e6
    assert p_bert / p_albert > 9
    f_albert, f_bert = _matmul_flops(albert), _matmul_flops(bert)
    print(f"forward matmul FLOPs at seq {SEQ}: albert-base {f_albert:.3e}, bert-base {f_bert:.3e}")
    assert abs(f_albert / f_bert - 1) < 0.03  # the same compute, not 9x less
    # With its heads (MLM through E, SOP on the pooler) it does no less either.
    assert _matmul_flops(preset("albert-base", pooler=True, pair_head=True)) > 0.97 * f_bert


@pytest.mark.parametrize("fields,match", [
    ({"arch": "decoder", "embed_dim": 16}, "embed_dim .* only applies to arch='encoder'"),
    ({"arch": "decoder", "share_layers": True}, "share_layers .* only applies to arch='encoder'"),
    ({"arch": "decoder", "pair_head": True, "pooler": False}, "pair_head .* only applies to arch='encoder'"),
    ({"arch": "encoder", "lm_head": True, "pair_head": True}, "pair_head classifies the pooler's output"),
    ({"arch": "encoder", "embed_dim": 0}, "embed_dim must be at least 1"),
    ({"arch": "encoder", "share_layers": True, "attn_dilation": [1, 2, 1, 2]}, "share_layers runs one layer"),
])
def test_bad_albert_fields_are_one_line_errors(fields, match):
    with pytest.raises(TformerError, match=match) as err:
        ModelConfig(**fields)
    assert "\n" not in str(err.value)
