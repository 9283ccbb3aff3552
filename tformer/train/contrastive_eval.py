"""Held-out figures of a CLIP model trained on labelled images with captions (`tformer train --task contrastive`).

    zero-shot accuracy   each image gets the class whose prompts' embedding is nearest (cosine); no label seen
    recall@k             image -> text: is a caption of the image's class among the k most similar captions?
                         text -> image: is an image of the caption's class among the k most similar images?

A caption is relevant to every image of its class, not only the one it was drawn with: the captions of a class
repeat ("a handwritten 7" describes every 7), so only the class can say which retrieval is right.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from tformer.core.errors import TformerError

RECALL_KS = (1, 5)


def recall_at_k(similarity: torch.Tensor, relevant: torch.Tensor, ks=RECALL_KS) -> dict[int, float]:
    """The share of queries with at least one relevant item among their k most similar, for each k.
    similarity: (queries, items); relevant: (queries, items) bool. A k beyond the item count means all items."""
    if similarity.shape != relevant.shape or similarity.dim() != 2:
        raise TformerError(f"similarity {tuple(similarity.shape)} and relevance {tuple(relevant.shape)} must be the "
                           "same (queries, items) matrix")
    order = similarity.argsort(dim=1, descending=True, stable=True)
    hits = relevant.gather(1, order)  # (queries, items): relevance in rank order
    return {k: float(hits[:, : min(k, hits.shape[1])].any(dim=1).float().mean()) for k in ks}


def class_embeddings(prompt_embeds: torch.Tensor) -> torch.Tensor:
    """(classes, prompts, D) -> (classes, D): each class's prompts normalised, averaged and normalised again
    (prompt ensembling, as in the CLIP paper)."""
    return F.normalize(F.normalize(prompt_embeds, dim=-1).mean(dim=1), dim=-1)


def zero_shot_predict(image_embeds: torch.Tensor, prompt_embeds: torch.Tensor) -> torch.Tensor:
    """(N, D) images, (classes, prompts, D) prompts -> (N,) the class whose prompts are nearest each image."""
    return (F.normalize(image_embeds, dim=-1) @ class_embeddings(prompt_embeds).T).argmax(dim=-1)


@dataclass
class ContrastiveScores:
    pairs: int  # held-out image-caption pairs
    classes: int
    prompts_per_class: int
    zero_shot_accuracy: float
    image_to_text_recall: dict[str, float]  # "1", "5" -> share
    text_to_image_recall: dict[str, float]

    def as_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def contrastive_scores(model, pairs, labels: torch.Tensor, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       batch_size: int = 256) -> ContrastiveScores:
    """Score a CLIP model (tformer.model.CLIPModel) on held-out ``pairs`` (a Batch: pixel_values, input_ids,
    attention_mask; caption i with image i) whose classes are ``labels`` (N,), with every class's prompts
    ``prompt_ids`` / ``prompt_mask`` (classes, prompts, T) for zero-shot."""
    model.eval()
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in pairs.inputs.items()}

    def embed(fn, *tensors):
        parts = [fn(*(t[i:i + batch_size] for t in tensors))[0] for i in range(0, len(tensors[0]), batch_size)]
        return F.normalize(torch.cat(parts).float(), dim=-1)

    images = embed(model.image_features, inputs["pixel_values"])
    texts = embed(model.text_features, inputs["input_ids"], inputs["attention_mask"])
    k, p, t = prompt_ids.shape
    flat = lambda x: x.reshape(k * p, t).to(device)
    prompts = embed(model.text_features, flat(prompt_ids), flat(prompt_mask))
    labels = labels.to(device)
    relevant = labels[:, None] == labels[None, :]
    similarity = images @ texts.T  # (images, captions)
    predicted = zero_shot_predict(images, prompts.reshape(k, p, -1))
    as_keys = lambda r: {str(key): v for key, v in r.items()}
    return ContrastiveScores(pairs=len(labels), classes=k, prompts_per_class=p,
                             zero_shot_accuracy=float((predicted == labels).float().mean()),
                             image_to_text_recall=as_keys(recall_at_k(similarity, relevant)),
                             text_to_image_recall=as_keys(recall_at_k(similarity.T, relevant.T)))
