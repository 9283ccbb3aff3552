"""What a model's vocabulary costs (the large-vocabulary analysis: Gemma 3's 262,144 tokens make its token table
63% of the parameters): shares of parameters, FLOPs, bytes read per decoded token and training memory.
Read by `tformer count` and the report's "A real model"."""

from __future__ import annotations

from dataclasses import replace

from tformer.cost.ledger import ledger
from tformer.cost.memory import vocabulary_bytes


def vocabulary_shares(config, workload) -> dict | None:
    """What the vocabulary costs, as shares (the large-vocabulary analysis: Gemma 3's 262,144 tokens): of the
    parameters (the token table), of a training step's matmul FLOPs and of a decoded token's (the LM head), of the
    bytes a decode step reads (the table's row and the head's weights) and of a training step's memory (the
    logits and what the loss keeps). None for a model without an LM head."""
    lg = ledger(config, workload)
    if lg.architecture.lm_head is None:
        return None
    seq = max(workload.seq, 2)
    train = lg if workload.training else ledger(config, replace(workload, phase="train", seq=seq))
    step = ledger(config, replace(workload, phase="decode", seq=seq, context=seq - 1))

    def head_share(led, attr):
        ops = [op for op in led.ops if op.name.split(".")[0] in ("lm_head", "tok_embed")]
        whole = led.total(led.ops, attr)
        return led.total(ops, attr) / whole if whole else 0.0

    tables = sum(op.params for op in lg.ops if op.name == "tok_embed")
    return {"embedding_params": tables, "embedding_params_share": tables / lg.params["total"],
            "head_flops_share_train": head_share(train, "matmul_flops"),
            "head_flops_share_decode": head_share(step, "matmul_flops"),
            "head_bytes_share_decode": head_share(step, "bytes_read"),
            "logits_memory_share_train": vocabulary_memory(train)["logits_share"], "train_batch_seq": [train.workload.batch,
                                                                                               train.workload.seq]}


def vocabulary_memory(lg) -> dict:
    """The (tokens x vocabulary) part of the memory (cost.memory.vocabulary_bytes) and its share of the total."""
    part, total = vocabulary_bytes(lg), lg.memory["total"]
    return {"logits_and_loss": part, "logits_share": part / total if total else 0.0}


__all__ = ["vocabulary_memory", "vocabulary_shares"]
