"""Task heads in place of the LM head (config.task), as Hugging Face's heads compute them:

    sequence-classification  one vector per sequence -> dropout -> Linear(d, n_classes)
        pooling cls:  the first token's state, through the pooler when the model has one (BertForSequenceClassification)
        pooling mean: the mean of the real tokens' states (sentence-transformers, all-MiniLM-L6-v2)
        pooling last: the last real token's state (GPT2ForSequenceClassification, LlamaForSequenceClassification)
        loss: cross-entropy; n_classes = 1: mean squared error (regression); float labels over several classes:
              binary cross-entropy per class (multi-label), as HF's problem_type picks
    token-classification     every token -> dropout -> Linear(d, n_classes); cross-entropy, -100 = not scored
    question-answering       every token -> Linear(d, 2): a start and an end score per token; the loss is the mean
                             of the two cross-entropies over positions (a position beyond the sequence: not scored)

The head is the model's ``head`` module (a Linear, parameters "head.weight" / "head.bias"; the ledger's
Architecture.classifier); its outputs go into ModelOutput.logits (start_logits / end_logits for answers).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from tformer.core.errors import TformerError
from tformer.model.base import IGNORE_INDEX
from tformer.model.runner_base import Batch, Runner, Scored


def pool(h: torch.Tensor, pooling: str, attention_mask: torch.Tensor | None, input_ids: torch.Tensor | None,
         pad_token_id: int | None, pooled: torch.Tensor | None = None) -> torch.Tensor:
    """One vector per sequence from the states ``h`` (B, T, d) -> (B, d). ``pooled``: the pooler's output (cls)."""
    if pooling == "cls":
        return pooled if pooled is not None else h[:, 0]
    if pooling == "mean":
        weights = _real_tokens(attention_mask, input_ids, pad_token_id, h).to(h.dtype)[..., None]  # (B, T, 1)
        return (h * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    # last: the rightmost real token (right padding: before the pads; left padding: the last column). Real as
    # GPT2ForSequenceClassification reads it: an id that is not pad_token_id, whatever the mask says (a model
    # whose pad id is its end-of-text id pools the token before a trailing one), else the mask.
    real = _real_tokens(attention_mask, input_ids, pad_token_id, h, ids_first=True)
    index = (torch.arange(h.shape[1], device=h.device) * real).argmax(-1)
    return h[torch.arange(h.shape[0], device=h.device), index]


def _real_tokens(attention_mask, input_ids, pad_token_id, h, ids_first: bool = False) -> torch.Tensor:
    """(B, T) 1 where a token is real: the mask, else the ids that are not padding (``ids_first``: the ids
    before the mask), else every token."""
    by_ids = input_ids is not None and pad_token_id is not None
    if by_ids and (ids_first or attention_mask is None):
        return input_ids.ne(pad_token_id).long()
    if attention_mask is not None:
        return attention_mask[:, -h.shape[1]:].long()
    return torch.ones(h.shape[:2], dtype=torch.long, device=h.device)


def task_outputs(model, h: torch.Tensor, pooled: torch.Tensor | None, input_ids, attention_mask, labels=None,
                 start_positions=None, end_positions=None) -> dict:
    """The head's outputs on the last stack's states ``h`` (B, T, d): the ModelOutput fields (logits, loss;
    start_logits / end_logits for answers). ``model``: an encoder or decoder built with a task head."""
    c = model.config
    if c.task == "question-answering":
        logits = model.head(model.head_dropout(h))  # (B, T, 2)
        start, end = (x.squeeze(-1).contiguous() for x in logits.split(1, dim=-1))  # (B, T) each
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = answer_loss(start, end, start_positions, end_positions)
        elif labels is not None:
            raise TformerError("a question-answering head takes start_positions and end_positions, not labels")
        return {"start_logits": start, "end_logits": end, "loss": loss}
    if c.task == "token-classification":
        logits = model.head(model.head_dropout(h))  # (B, T, n_classes)
    else:
        vector = pool(h, c.pooling, attention_mask, input_ids, c.pad_token_id, pooled)
        logits = model.head(model.head_dropout(vector))  # (B, n_classes)
    loss = classification_loss(logits, labels) if labels is not None else None
    return {"logits": logits, "loss": loss}


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF's problem_type, read off the head and the labels: one output = regression (MSE); integer labels =
    one class each (cross-entropy, -100 skipped); float labels of the logits' shape = multi-label (BCE)."""
    n = logits.shape[-1]
    if n == 1:
        return F.mse_loss(logits.float().squeeze(), labels.float().squeeze())
    if labels.is_floating_point() and labels.shape == logits.shape:
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    if labels.is_floating_point():
        raise TformerError(f"labels of shape {tuple(labels.shape)} are not whole class ids; give class ids (long) "
                           f"or one float per class ({tuple(logits.shape)}) for multi-label")
    if labels.numel() and labels.device.type != "meta" and int(labels.max()) >= n:
        raise TformerError(f"label {int(labels.max())} is outside the head's {n} classes [0, {n}); "
                           f"set n_classes to the number of classes")
    return F.cross_entropy(logits.float().reshape(-1, n), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def answer_loss(start: torch.Tensor, end: torch.Tensor, start_positions: torch.Tensor,
                end_positions: torch.Tensor) -> torch.Tensor:
    """Mean of the start and end cross-entropies over the T positions (B, T); a position outside [0, T) is
    clamped to T and not scored (an answer cut off by truncation), as BertForQuestionAnswering."""
    T = start.shape[1]
    sp, ep = start_positions.reshape(-1).clamp(0, T), end_positions.reshape(-1).clamp(0, T)
    return (F.cross_entropy(start.float(), sp, ignore_index=T) + F.cross_entropy(end.float(), ep, ignore_index=T)) / 2


class TaskRunner(Runner):
    """An encoder or decoder with a task head: batches of token ids with their labels (targets: (B,) classes or
    regression values, (B, T) token classes, or (B, 2) an answer's start and end). It does not generate."""
    accuracy_metric = "accuracy"

    @property
    def generates(self) -> bool:
        return False

    @property
    def objective(self) -> str:
        return self.config.task

    def _score(self, batch: Batch, module, label_smoothing, autocast, stand_in, chunk, count) -> Scored:
        """The head's loss on ``batch`` (the model computes it, as HF's heads do); with ``count`` the right answers
        of the top class (answers: both start and end right)."""
        self.check_chunk(chunk)
        if label_smoothing:
            raise TformerError("label smoothing is for token prediction; a task head's loss takes none (drop it)")
        t = batch.targets
        extra = {"start_positions": t[:, 0], "end_positions": t[:, 1]} if self.config.task == "question-answering" \
            else {"labels": t}
        with autocast if autocast is not None else contextlib.nullcontext():
            out = (module if module is not None else self.model)(**batch.inputs, **extra)
        if count and not (self.config.task == "sequence-classification"
                          and self.config.n_classes == 1):  # regression: no right answers
            return Scored(out.loss.float(), *self.correct(out, t))
        return Scored(out.loss.float())

    def correct(self, out, targets: torch.Tensor) -> list[int]:
        """[correct, scored] of the predictions in ``out`` against ``targets`` (a classifier's, or an answer's)."""
        if self.config.task == "question-answering":
            hit = (out.start_logits.argmax(-1) == targets[:, 0]) & (out.end_logits.argmax(-1) == targets[:, 1])
            return [int(hit.sum()), len(targets)]
        scored = targets != IGNORE_INDEX
        return [int(((out.logits.argmax(-1) == targets) & scored).sum()), int(scored.sum())]
