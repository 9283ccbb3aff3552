"""A synthetic long-range recall task: a key-value pair is shown once, and the key is queried k tokens
later, across distractors; the answer is the value. It measures how far back a model can reach, which is
what separates a recurrent state (it must carry the value through every step) from attention (it reads
the value's position directly).

One row (ids, left to right; p = a random prefix of distractors, k1 < k2 < ... the distances):

    d d .. d  KEY VALUE  d d .. d  KEY  d .. d  KEY  d ..  d  KEY
    0 ..  p-1  p   p+1              p+k1         p+k2        p+kmax = the last position when p = prefix

Every query (the key again) is labelled with the value; every other position is IGNORE_INDEX, so the loss
and the accuracy read the query positions only, and one row scores every distance of the grid. The value
appears once and is never shown again, so each query recalls it from k tokens back (k - 1 from the value).

Vocabulary, disjoint ranges: distractors [0, D), keys [D, D + K), values [D + K, D + K + V).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tformer.core.errors import TformerError

IGNORE_INDEX = -100


@dataclass(frozen=True)
class RecallTask:
    distances: tuple[int, ...] = tuple(range(8, 513, 8))  # k: query position - key position
    n_distractors: int = 16
    n_keys: int = 4
    n_values: int = 8  # chance accuracy is 1 / n_values
    prefix: int = 16  # the key sits at a random position in [0, prefix]

    def __post_init__(self):
        ks = self.distances
        if not ks or min(ks) < 2 or len(set(ks)) != len(ks):
            raise TformerError(f"recall distances must be distinct and at least 2 (the value follows the key), "
                               f"got {ks}")
        if min(self.n_distractors, self.n_keys, self.n_values) < 1 or self.prefix < 0:
            raise TformerError("a recall task needs at least one distractor, key and value and a prefix >= 0")

    @property
    def vocab_size(self) -> int:
        return self.n_distractors + self.n_keys + self.n_values

    @property
    def seq_len(self) -> int:
        return self.prefix + max(self.distances) + 1

    @property
    def first_value(self) -> int:
        return self.n_distractors + self.n_keys

    def up_to(self, span: int) -> RecallTask:
        """The same task with only the distances <= ``span`` (shorter rows: prefix + span + 1 tokens)."""
        kept = tuple(k for k in self.distances if k <= span)
        if not kept:
            raise TformerError(f"no recall distance is <= {span}; the shortest is {min(self.distances)}")
        return replace(self, distances=kept)


def recall_batch(task: RecallTask, rows: int, generator: torch.Generator | None = None,
                 prefix: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (rows, n), labels (rows, n): the value at each query, IGNORE_INDEX elsewhere, queries
    (rows, len(distances)): the query positions in the order of task.distances). ``prefix`` fixes the
    key's position (task.prefix puts the farthest query on the last position); None draws it per row."""
    if rows < 1:
        raise TformerError(f"a recall batch needs at least one row, got {rows}")
    if prefix is not None and not 0 <= prefix <= task.prefix:
        raise TformerError(f"recall prefix {prefix} is outside [0, {task.prefix}]")
    n = task.seq_len
    ids = torch.randint(0, task.n_distractors, (rows, n), generator=generator)
    starts = (torch.full((rows,), prefix, dtype=torch.long) if prefix is not None
              else torch.randint(0, task.prefix + 1, (rows,), generator=generator))
    keys = task.n_distractors + torch.randint(0, task.n_keys, (rows,), generator=generator)
    values = task.first_value + torch.randint(0, task.n_values, (rows,), generator=generator)
    row = torch.arange(rows)
    ids[row, starts] = keys
    ids[row, starts + 1] = values
    queries = starts[:, None] + torch.tensor(task.distances)[None, :]
    labels = torch.full((rows, n), IGNORE_INDEX, dtype=torch.long)
    for j in range(queries.shape[1]):
        ids[row, queries[:, j]] = keys
        labels[row, queries[:, j]] = values
    return ids, labels, queries


__all__ = ["IGNORE_INDEX", "RecallTask", "recall_batch"]
