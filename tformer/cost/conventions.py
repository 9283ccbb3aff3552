"""The conventions in force, as text that goes out with every table and every JSON document,
and the other conventions people count by (so their numbers can be reproduced and compared)."""

from __future__ import annotations


def conventions(workload) -> dict:
    w = workload
    out = {
        "flops": "FLOPs = 2 x multiply-accumulates. flops.matmul counts mm/addmm/bmm as torch FlopCounterMode "
                 "does (bias adds excluded); flops.other counts element-wise work by the per-element "
                 "conventions in tformer/cost/ops.py; flops.total = matmul + other",
        "attention_flops": "full: QK^T and AV over every query-key pair (the reference path, FlopCounterMode)"
        if w.attention_flops == "full" else
        "causal (labelled, not FlopCounterMode): only the query-key pairs the causal mask allows, T(T+1)/2 per sequence",
        "decode": "one new token per sequence attends to context+1 keys; LM head on the new token only",
        "lm_head": "forward/train/prefill apply the LM head to every position",
        "train": "backward matmul FLOPs = 2 x forward; train = forward + backward (+ recompute with checkpointing) "
                 "+ optimizer element-wise work",
        "params": "every tensor once (tied embedding/head once); biases, norms, position and token-type tables counted; "
                  "embedding = token, token-type and position tables (an untied LM head is non-embedding)",
        "bytes": "exact integers in JSON; human output says GB (1e9) or GiB (2^30)",
        "dtype": f"{w.dtype}" + (" weights with fp16 activations and KV cache (weights-only quantisation)" if w.dtype == "int8" else ""),
        "kv_cache": "2 x layers x tokens x kv_heads x head_dim x batch x bytes (+ cross-attention keys/values of the "
                    "encoder output for an encoder-decoder)",
        "activations": "training: Korthikanti et al. 2022 accounting (tensors kept for backward); "
                       "inference: largest single op's inputs + output",
        "rules_of_thumb": "6ND (train) / 2ND (forward) with N = non-embedding parameters, D = tokens processed",
    }
    return out


# The course assignment's per-layer formula ----------------------------------------------------------
# The assignment counts a layer as 20·T·d² + 4·T²·d "FLOPs". Its 20 mixes units: the four d x d
# attention projections are counted as 4·T·d² multiply-accumulates (not 8·T·d² FLOPs), the FFN
# as 16·T·d² FLOPs (2 FLOPs per MAC), QK^T and AV as 4·T²·d FLOPs, and the LM head is left out.
# Reweighting the ledger's matmul ops by kind reproduces it from the same op list.
COURSE_WEIGHTS = {"qkv_proj": 0.5, "out_proj": 0.5, "ffn_up": 1, "ffn_gate": 1, "ffn_down": 1,
                  "scores": 1, "context": 1, "lm_head": 0, "pooler": 0}


def course_flops(ledger) -> int:
    """Forward matmul 'FLOPs' as the course assignment's per-layer formula counts them."""
    total = 0
    for op in ledger.select(phase="forward"):
        weight = COURSE_WEIGHTS.get(op.kind, 0)
        total += op.matmul_flops * weight
    return int(total)


def macs(flops: int) -> int:
    """Multiply-accumulates for a FLOP count under the 2-FLOPs-per-MAC convention."""
    return flops // 2


__all__ = ["conventions", "course_flops", "COURSE_WEIGHTS", "macs"]
