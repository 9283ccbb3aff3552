"""CLIP's held-out figures on hand-made embeddings: recall@k, prompt ensembling, zero-shot."""

import pytest
import torch

from tformer.core.errors import TformerError
from tformer.train.contrastive_eval import class_embeddings, recall_at_k, zero_shot_predict


def test_recall_at_k_on_a_hand_made_similarity():
    # 4 queries x 5 items; the relevant item of query q is item q (identity relevance on the first 4 items).
    similarity = torch.tensor([[0.9, 0.1, 0.2, 0.3, 0.0],   # rank 1: right
                               [0.8, 0.7, 0.1, 0.0, 0.2],   # rank 2
                               [0.5, 0.6, 0.4, 0.7, 0.9],   # rank 5
                               [0.1, 0.2, 0.3, 0.4, 0.0]])  # rank 1
    relevant = torch.eye(4, 5, dtype=torch.bool)
    r = recall_at_k(similarity, relevant, ks=(1, 2, 4, 5))
    assert r == {1: 0.5, 2: 0.75, 4: 0.75, 5: 1.0}


def test_recall_counts_any_relevant_item_and_caps_k():
    similarity = torch.tensor([[0.1, 0.9, 0.5], [0.3, 0.2, 0.1]])
    relevant = torch.tensor([[True, False, True], [False, False, True]])  # same-class items, several per query
    assert recall_at_k(similarity, relevant, ks=(1, 2, 10)) == {1: 0.0, 2: 0.5, 10: 1.0}


def test_recall_refuses_mismatched_shapes():
    with pytest.raises(TformerError, match="same"):
        recall_at_k(torch.zeros(2, 3), torch.zeros(3, 2, dtype=torch.bool))


def test_zero_shot_uses_the_mean_of_each_class_prompts():
    # Class 0's prompts point along x and y, class 1's along -x; their ensembles are (1,1)/sqrt2 and (-1,0).
    prompts = torch.tensor([[[1.0, 0.0], [0.0, 2.0]], [[-3.0, 0.0], [-1.0, 0.0]]])
    ensemble = class_embeddings(prompts)
    assert torch.allclose(ensemble, torch.tensor([[0.5 ** 0.5, 0.5 ** 0.5], [-1.0, 0.0]]))
    images = torch.tensor([[0.1, 1.0], [-1.0, 0.5], [-0.2, -1.0]])
    assert zero_shot_predict(images, prompts).tolist() == [0, 1, 1]
