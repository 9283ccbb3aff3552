"""Fine-tuning a model on labelled text (`tformer finetune`, bench/finetune.py): the model from a preset, a tformer
checkpoint, a Hugging Face folder or a packaged checkpoint (all-minilm-l6-v2) with a sequence-classification head,
the fine-tuning method applied (tformer.adapt.apply_peft), and a batch source over the labelled lines. Training is
tformer.train.loop's Trainer, which optimises only the parameters that take a gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tformer.adapt import apply_peft
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.core.peft import PeftSpec
from tformer.data.authorship import labelled_data
from tformer.data.batch import Batch
from tformer.data.gguf_models import PACKAGED_GGUF
from tformer.data.labelled import LabelledText
from tformer.data.tokenizers import WordPieceTokenizer
from tformer.data.weights import CHECKPOINTS, checkpoint_dir
from tformer.interop.checkpoint import find_tokenizer, model_dir, read_state_dict
from tformer.interop.config import load_config
from tformer.interop.gguf_config import resolve_gguf
from tformer.interop.gguf_file import open_gguf
from tformer.interop.gguf_model import load_gguf
from tformer.interop.gguf_tokenizer import tokenizer_from_gguf
from tformer.interop.hf_config import is_hf_config
from tformer.model import build
from tformer.model.base import IGNORE_INDEX
from tformer.model.runners import runner_for
from tformer.train.setup import _load_pretrained
from tformer.train.sources import _Sampled

TASKS = ("sequence-classification",)  # what labelled lines train; the other heads need token or span labels
DEFAULT_FROM = "all-minilm-l6-v2"
TOKENIZER_FROM = "all-minilm-l6-v2"  # the WordPiece vocabulary a model without its own tokenizer reads
# sentence-transformers pools all-MiniLM-L6-v2 by the mean of the token states; other models keep the config's own
DEFAULT_POOLING = {"all-minilm-l6-v2": "mean"}


@dataclass
class Origin:
    """Where the model comes from: kind "hf" (a Hugging Face folder or packaged checkpoint), "tformer" (a tformer
    checkpoint or run folder), "gguf" (a GGUF file or packaged one, dequantized) or "preset" (random init);
    ``path`` is the folder or file (None for a preset)."""

    kind: str
    name: str
    path: Path | None


@dataclass
class FinetuneRun:
    model: torch.nn.Module
    source: TextClassificationSource
    tokenizer: object
    data: LabelledText
    spec: PeftSpec
    origin: Origin
    new_head: bool  # the task head starts from random init
    objective: str = "sequence-classification"


def resolve_origin(name: str) -> Origin:
    if name in CHECKPOINTS:
        return Origin("hf", name, checkpoint_dir(name))
    if name in PACKAGED_GGUF or name.endswith(".gguf"):
        return Origin("gguf", name, resolve_gguf(name))
    path = Path(name).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if config_file.is_file() and is_hf_config(read_json(config_file, "model config", fix="restore the folder")):
            return Origin("hf", name, path)
        return Origin("tformer", name, model_dir(path))
    if "/" in name or path.suffix:
        raise TformerError(f"--from {name}: no such folder; give a preset name, a tformer run folder, a Hugging Face "
                           f"model folder or {DEFAULT_FROM}")
    return Origin("preset", name, None)


def finetune_config(origin: Origin, task: str, n_classes: int, pooling: str | None,
                    overrides: list[str]) -> ModelConfig:
    """The origin's config with a task head of ``n_classes`` (and ``--set`` overrides); bad pairs refused."""
    if task not in TASKS:
        raise TformerError(f"--task {task}: labelled lines train a sequence classifier only (token classification "
                           "and question answering need per-token or answer-span labels); use --task "
                           "sequence-classification")
    config = load_config(origin.path if origin.path is not None else origin.name, overrides=overrides)
    if not (config.traits.text_encoder or config.traits.decoder_only):
        raise TformerError(f"--from {origin.name} is {config.traits.label}; a classification head goes on an encoder "
                           "or a decoder (e.g. --from all-minilm-l6-v2 or --from gpt2)")
    pooling = pooling or DEFAULT_POOLING.get(origin.name)
    if pooling == "cls" and config.traits.decoder:
        raise TformerError(f"--pooling cls reads the first token, which in a decoder ({origin.name}) sees no other "
                           "token; use --pooling last (the default for decoders) or mean")
    return config.replace(task=task, n_classes=n_classes, pooling=pooling)


def finetune_tokenizer(origin: Origin):
    """The origin's own tokenizer where it has one, else all-MiniLM-L6-v2's WordPiece."""
    if origin.kind == "tformer":
        found = find_tokenizer(origin.path, origin.path.parent)
        if found is not None:
            return found
    if origin.kind == "gguf":
        with open_gguf(origin.path) as f:
            return tokenizer_from_gguf(f.metadata)
    if origin.kind == "hf" and any((origin.path / f).is_file() for f in ("tokenizer.json", "vocab.txt")):
        return WordPieceTokenizer.from_checkpoint(origin.path)
    return WordPieceTokenizer.from_checkpoint(checkpoint_dir(TOKENIZER_FROM))


def build_finetune(from_: str = DEFAULT_FROM, data: str = "authorship", task: str = "sequence-classification",
                   pooling: str | None = None, spec: PeftSpec | None = None, max_len: int = 64, seed: int = 1337,
                   overrides: list[str] | None = None, data_seed: int = 0) -> FinetuneRun:
    """Model (weights loaded, head added, ``spec`` applied), labelled data and its batch source."""
    spec = spec or PeftSpec(method="full")
    origin = resolve_origin(from_)
    labelled = labelled_data(data, data_seed)
    config = finetune_config(origin, task, len(labelled.classes), pooling, list(overrides or []))
    tok = finetune_tokenizer(origin)
    if origin.kind == "preset":
        config = config.replace(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id)
    elif tok.vocab_size > config.vocab_size:
        raise TformerError(f"the tokenizer has {tok.vocab_size} tokens but {from_}'s vocabulary is "
                           f"{config.vocab_size}; fine-tune with the checkpoint's own tokenizer")
    if max_len < 2:
        raise TformerError(f"--max-len must be at least 2 (a token and the end marker), got {max_len}")
    max_len = min(max_len, config.max_positions)
    torch.manual_seed(seed)
    model = build(config)
    new_head = _load_origin(model, origin)
    apply_peft(model, spec)
    source = TextClassificationSource(labelled, tok, max_len, seed)
    return FinetuneRun(model, source, tok, labelled, spec, origin, new_head)


def _load_origin(model, origin: Origin) -> bool:
    """Copy the origin's weights in (each tensor whose name and shape fit); whether the head kept its random init."""
    if origin.kind == "preset":
        return True
    before = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("head.")}
    if origin.kind == "hf":
        _load_pretrained(model, str(origin.path))
    else:
        ours = model.state_dict()
        found = (load_gguf(origin.path, weights="dequantize").state_dict() if origin.kind == "gguf"
                 else read_state_dict(origin.path))
        weights = {k: v for k, v in found.items() if k in ours and ours[k].shape == v.shape}
        model.load_state_dict(weights, strict=False)
        if model.config.tied_embeddings:
            model.tie_weights()
    after = model.state_dict()
    return all(torch.equal(before[k], after[k]) for k in before)


class TextClassificationSource(_Sampled):
    """Labelled texts as token-id rows ([CLS] text [SEP] where the tokenizer has them, cut to ``max_len``), drawn at
    random with replacement and padded to the longest row of the batch (attention_mask marks the real tokens);
    targets: the classes (B,). Validation and test walk their split in order (at most n batches of ``rows``)."""

    def __init__(self, data: LabelledText, tokenizer, max_len: int, seed: int):
        super().__init__(seed)
        for split in ("train", "validation", "test"):
            if not data.texts(split):
                raise TformerError(f"the {split} split of {data.name} is empty; give more labelled rows")
        self.data, self.max_len = data, max_len
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
        special = tokenizer.special_ids
        self.wrap = (special.get("cls"), special.get("sep")) if "cls" in special and "sep" in special else None
        self.rows = {split: self._encode(tokenizer, data.texts(split)) for split in ("train", "validation", "test")}
        self.labels = {split: torch.tensor(data.labels(split), dtype=torch.long) for split in self.rows}
        self.tokens_per_row = max(1, round(float(np.mean([len(r) for r in self.rows["train"]]))))
        self.val = self.rows["validation"]

    def _encode(self, tokenizer, texts: list[str]) -> list[list[int]]:
        ids = tokenizer.encode_batch(texts)
        if self.wrap is None:
            return [row[: self.max_len] or [self.pad_id] for row in ids]
        cls_id, sep_id = self.wrap
        return [[cls_id, *row[: self.max_len - 2], sep_id] for row in ids]

    def _batch(self, split: str, index) -> Batch:
        rows = [self.rows[split][i] for i in index]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return Batch({"input_ids": ids, "attention_mask": mask}, self.labels[split][list(index)])

    def next_batch(self, rows: int) -> Batch:
        index = torch.randint(0, len(self.rows["train"]), (rows,), generator=self.generator).tolist()
        return self._batch("train", index)

    def split_batches(self, split: str, n: int | None, rows: int):
        """The split in order, ``rows`` at a time; n: at most that many batches (None: all)."""
        total = len(self.rows[split]) if n is None else min(n * rows, len(self.rows[split]))
        for start in range(0, total, rows):
            yield self._batch(split, range(start, min(start + rows, total)))

    def eval_batches(self, n: int, rows: int):
        return self.split_batches("validation", n, rows)


@torch.no_grad()
def held_out_scores(model, source: TextClassificationSource, split: str = "test", rows: int = 64,
                    batches: int | None = None) -> dict:
    """Loss and accuracy of ``model`` on a held-out split (all of it, or the first ``batches`` batches)."""
    runner = runner_for(model)
    was_training = model.training
    model.eval()
    total, count, correct, scored = 0.0, 0, 0, 0
    for batch in source.split_batches(split, batches, rows):
        score = runner.scored(batch)
        n = int((batch.targets != IGNORE_INDEX).sum())
        total, count = total + score.loss.item() * n, count + n
        correct, scored = correct + score.right, scored + score.rows
    model.train(was_training)
    return {"split": split, "rows": scored, "loss": total / max(count, 1), "accuracy": correct / max(scored, 1)}


__all__ = ["DEFAULT_FROM", "FinetuneRun", "Origin", "TextClassificationSource", "build_finetune", "finetune_config",
           "held_out_scores", "resolve_origin"]
