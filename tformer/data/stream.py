"""Token streams on disk: a flat uint16/uint32 array, memory-mapped, with a JSON sidecar.

A split of a corpus is one long sequence of token ids (``train.bin``); a training example is any
window of ``seq_len + 1`` consecutive ids, input the first ``seq_len`` and target the last
``seq_len`` (the next token at every position). Memory mapping means a 10 MB or a 10 GB stream
opens instantly and only the windows a batch touches are read.

The sidecar (``train.json``) is written after the .bin, both by rename, so a stream with a
sidecar is complete; the sidecar records dtype, token count, vocabulary size and tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tformer.core.atomic import atomic_file, atomic_write_text
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.data.tokenizers import load

FORMAT = "tformer-tokens"
VERSION = 1
SPLIT_ALIASES = {"val": "validation", "valid": "validation", "dev": "validation", "eval": "validation"}


def dtype_for(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (GPT-2's 50,257 does), uint32 otherwise: half the disk and page cache."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def write_stream(path, chunks, vocab_size: int, meta: dict | None = None) -> TokenStream:
    """Write token-id chunks (iterables of ints or arrays) as ``path`` (.bin) + sidecar, atomically."""
    path = Path(path)
    dtype = dtype_for(vocab_size)
    count = 0
    with atomic_file(path, "wb") as f:
        for chunk in chunks:
            arr = np.asarray(chunk, dtype=np.int64)
            if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
                raise TformerError(f"token id {int(arr.max())} does not fit a vocabulary of {vocab_size}; "
                                   "the tokenizer and vocab_size disagree")
            f.write(arr.astype(dtype).tobytes())
            count += arr.size
    sidecar = {"format": FORMAT, "version": VERSION, "dtype": dtype.name, "count": count,
               "vocab_size": vocab_size, **(meta or {})}
    _atomic_write_json(sidecar_path(path), sidecar)
    return TokenStream(path)


def sidecar_path(path: Path) -> Path:
    return Path(path).with_suffix(".json")


def _atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


class TokenStream:
    """One split's token ids, memory-mapped read-only."""

    def __init__(self, path):
        self.path = Path(path)
        side = sidecar_path(self.path)
        if not side.is_file() or not self.path.is_file():
            raise TformerError(f"{self.path} is not a complete token stream (no .bin or .json sidecar); "
                               "prepare the data again with `tformer data get`")
        self.meta = read_json(side, "token stream sidecar", fix="prepare the data again with `tformer data get`")
        if self.meta.get("format") != FORMAT:
            raise TformerError(f"{side} is not a {FORMAT} sidecar; prepare the data again with `tformer data get`")
        self.dtype = np.dtype(self.meta["dtype"])
        self.vocab_size = int(self.meta["vocab_size"])
        expected = int(self.meta["count"]) * self.dtype.itemsize
        if self.path.stat().st_size != expected:
            raise TformerError(f"{self.path} holds {self.path.stat().st_size} bytes, its sidecar says {expected}; "
                               "delete it and prepare the data again")
        # np.memmap cannot map an empty file; an empty stream is an empty array.
        self.tokens = (np.memmap(self.path, dtype=self.dtype, mode="r") if expected
                       else np.zeros(0, dtype=self.dtype))

    def __len__(self) -> int:
        return len(self.tokens)

    def windows(self, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets for windows starting at ``starts``: both (B, seq_len) int64."""
        idx = starts.numpy()[:, None] + np.arange(seq_len + 1)
        chunk = torch.from_numpy(self.tokens[idx].astype(np.int64))  # one gather from the map
        return chunk[:, :-1], chunk[:, 1:]

    def check_ids(self, vocab_size: int) -> None:
        """Every id inside [0, vocab_size): read once here, where training takes the stream, so the model's
        forward never has to look at its ids' values (a device-to-host sync per step on a GPU)."""
        if not len(self):
            return
        # Unsigned dtypes hold no negatives: the largest id is the one to check.
        top = int(self.tokens.max())
        if top >= vocab_size:
            raise TformerError(f"{self.path} holds token id {top}, outside the model's vocabulary [0, {vocab_size}); "
                               "prepare the data again with the model's tokenizer (`tformer data get`)")

    def check_seq_len(self, seq_len: int, name: str = "") -> None:
        if seq_len < 1:
            raise TformerError(f"sequence length must be at least 1, got {seq_len}")
        if seq_len + 1 > len(self):
            raise TformerError(f"sequence length {seq_len} is longer than the {name or self.path.stem} stream "
                               f"({len(self)} tokens; a window needs seq_len + 1); use a --seq-len below "
                               f"{len(self)} or a larger corpus")

    def sample(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None):
        """Random windows (with replacement), drawn from ``generator`` so a seed fixes them."""
        self.check_seq_len(seq_len)
        starts = torch.randint(0, len(self) - seq_len, (batch_size,), generator=generator)
        return self.windows(starts, seq_len)


class TokenData:
    """The splits of one prepared corpus (``train.bin``, ``validation.bin``, ...) in one folder."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.splits = {p.stem: TokenStream(p) for p in sorted(self.directory.glob("*.bin"))}
        if "train" not in self.splits:
            raise TformerError(f"{self.directory} has no train.bin; prepare the data with `tformer data get`")

    def __getitem__(self, split: str) -> TokenStream:
        name = SPLIT_ALIASES.get(split, split)
        if name not in self.splits:
            raise TformerError(f"no split {split!r} here; this data has {', '.join(self.splits)}")
        return self.splits[name]

    @property
    def vocab_size(self) -> int:
        return self.splits["train"].vocab_size

    def tokenizer(self):
        return load(self.directory)

    def get_batch(self, split: str, batch_size: int, seq_len: int, generator: torch.Generator | None = None):
        """(x, y), each (batch_size, seq_len) int64, y = x shifted left by one: random windows of ``split``."""
        stream = self[split]
        stream.check_seq_len(seq_len, split)
        return stream.sample(batch_size, seq_len, generator)

    def batches(self, split: str, batch_size: int, seq_len: int, seed: int = 0,
                rank: int = 0, world_size: int = 1) -> BatchIterator:
        return BatchIterator(self[split], batch_size, seq_len, seed=seed, rank=rank, world_size=world_size)


class BatchIterator:
    """Endless shuffled epochs of non-overlapping windows, with a position you can save and restore.

    Epoch e cuts the stream into windows of ``seq_len + 1`` ids starting at a random shift in
    [0, seq_len), so windows differ from epoch to epoch, and visits them in a random order. Both
    are drawn from a generator seeded by (seed, epoch), so the batch at any position is a function
    of (seed, position) alone: `state_dict()` is three integers, and a restored iterator yields
    exactly what the uninterrupted one would have.

    With ``world_size`` > 1 each global batch is ``batch_size * world_size`` windows and rank r
    takes its r-th slice, so one process with batch B*N sees the same global batches as N
    processes with batch B.
    """

    def __init__(self, stream: TokenStream, batch_size: int, seq_len: int, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        if batch_size < 1:
            raise TformerError(f"batch size must be at least 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise TformerError(f"rank {rank} is outside world size {world_size}")
        stream.check_seq_len(seq_len)
        self.stream, self.batch_size, self.seq_len = stream, batch_size, seq_len
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.global_batch = batch_size * world_size
        if (len(stream) - seq_len) // (seq_len + 1) < self.global_batch:
            raise TformerError(f"the stream ({len(stream)} tokens) has fewer than {self.global_batch} windows of "
                               f"{seq_len + 1} tokens; use a smaller --batch-size or --seq-len")
        self.epoch, self.index = 0, 0  # index = windows of this epoch already consumed (globally)
        self._plan_epoch()

    def _plan_epoch(self) -> None:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        shift = int(torch.randint(0, self.seq_len, (1,), generator=g))
        n_windows = (len(self.stream) - shift - 1) // (self.seq_len + 1)
        if n_windows < self.global_batch:  # a large shift on a small stream: start at 0 instead
            shift, n_windows = 0, (len(self.stream) - 1) // (self.seq_len + 1)
        order = torch.randperm(n_windows, generator=g)
        self._starts = shift + order * (self.seq_len + 1)
        # Drop the tail that does not fill a global batch, so every batch has the same shape.
        self._batches_per_epoch = n_windows // self.global_batch

    @property
    def batches_per_epoch(self) -> int:
        return self._batches_per_epoch

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.index // self.global_batch >= self._batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
            self._plan_epoch()
        lo = self.index + self.rank * self.batch_size
        starts = self._starts[lo:lo + self.batch_size]
        self.index += self.global_batch
        return self.stream.windows(starts, self.seq_len)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "index": self.index,
                "batch_size": self.batch_size, "seq_len": self.seq_len, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        # The position only means the same thing under the same global batch and window length.
        for key in ("seq_len",):
            if state[key] != getattr(self, key):
                raise TformerError(f"the saved data position was for {key}={state[key]}, this run has "
                                   f"{getattr(self, key)}; resume with the same settings")
        saved_global = state["batch_size"] * state.get("world_size", 1)
        if saved_global != self.global_batch:
            raise TformerError(f"the saved data position was for a global batch of {saved_global} windows, this "
                               f"run has {self.global_batch}; resume with the same batch size and process count")
        self.seed, self.epoch, self.index = state["seed"], state["epoch"], state["index"]
        self._plan_epoch()
