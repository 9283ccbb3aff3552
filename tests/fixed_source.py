"""A training source over fixed random token rows, for tests that run the Trainer or a bench's loop without a
corpus: the next_batch / eval_batches / state_dict protocol of tformer.train.sources, each row predicting itself
shifted by one."""

from __future__ import annotations

import torch

from tformer.model.runner_base import Batch


class FixedTokenSource:
    def __init__(self, vocab: int, rows: int, length: int, seed: int = 0):
        self.tokens_per_row = length
        self.ids = torch.randint(0, vocab, (rows, length + 1), generator=torch.Generator().manual_seed(seed))

    def next_batch(self, rows):
        return Batch({"input_ids": self.ids[:rows, :-1]}, self.ids[:rows, 1:])

    def eval_batches(self, n, rows):
        return [self.next_batch(rows)]

    def state_dict(self):
        return {}
