"""BERT masking: 15% chosen, split 80/10/10, specials untouched, reproducible from a seed."""

import torch

from tformer.data.mlm import mask_tokens

PAD, CLS, SEP, MASK, V = 0, 1, 2, 3, 1000


def _corrupt(seed=0, rows=200):
    g = torch.Generator().manual_seed(123)
    ids = torch.randint(4, V, (rows, 2500), generator=g)  # 500k positions at 200 rows
    ids[:, 0], ids[:, -1], ids[:, -200:-1] = CLS, SEP, PAD
    inputs, labels = mask_tokens(ids, MASK, V, torch.Generator().manual_seed(seed), special_ids=(PAD, CLS, SEP))
    return ids, inputs, labels


def test_masking_proportions():
    ids, inputs, labels = _corrupt()
    chosen = labels != -100
    regular = (ids != PAD) & (ids != CLS) & (ids != SEP)
    n = int(regular.sum())
    # Binomial standard errors at these sizes are ~0.0005 (15%) and ~0.002 (80/10/10): 5 sigma bounds.
    assert abs(int(chosen.sum()) / n - 0.15) < 0.003
    k = int(chosen.sum())
    masked = (inputs[chosen] == MASK).sum().item() / k
    kept = (inputs[chosen] == ids[chosen]).sum().item() / k
    replaced = 1 - masked - kept
    assert abs(masked - 0.8) < 0.01 and abs(replaced - 0.1 * (1 - 1 / V)) < 0.008 and abs(kept - 0.1) < 0.008
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])  # unchosen positions are never touched
    assert not (chosen & ~regular).any()  # specials are never chosen


def test_masking_is_seeded_and_leaves_input_alone():
    ids = torch.randint(4, V, (4, 2500), generator=torch.Generator().manual_seed(5))
    before = ids.clone()

    def corrupt(seed):
        return mask_tokens(ids, MASK, V, torch.Generator().manual_seed(seed))

    (a, la), (b, lb), (c, _) = corrupt(0), corrupt(0), corrupt(1)
    assert torch.equal(a, b) and torch.equal(la, lb) and not torch.equal(a, c)
    assert torch.equal(ids, before)
