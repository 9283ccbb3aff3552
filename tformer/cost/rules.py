"""The rules of thumb (2ND for a forward pass, 6ND for a training step) beside the ledger's exact
count, and why the two differ. Reads a Ledger's totals; builds nothing."""

from __future__ import annotations


def rules_of_thumb(lg) -> dict:
    """2ND (forward) / 6ND (train) beside the ledger's matmul count, and why they differ.

    N = non-embedding parameters (the untied LM head included), D = tokens processed. The rule
    charges 2 FLOPs per weight per token; the exact count adds QK^T and AV (which have no weights
    and grow with sequence length), and leaves out parameters that do no matmul (biases, norms,
    relative-position tables) and the pooler's or decode's rows that skip part of the network.
    """
    w = lg.workload
    N = lg.params["non_embedding"]
    D = lg.tokens
    per = 6 if w.training else 2
    rule = per * N * D
    fwd = lg.select(phase="forward")
    attn = sum(op.matmul_flops for op in fwd if op.kind in ("scores", "context"))
    exact = lg.flops["by_phase"].get("forward", {}).get("matmul", 0)
    if w.training:
        exact = lg.flops["matmul"]
        attn *= 3
    # A tied head does 2·d·V FLOPs per token with weights the rule files under "embedding".
    tied_head = sum(op.matmul_flops for op in fwd if op.kind == "lm_head" and not op.params
                    and op.name != "mlm_head.dense") * (3 if w.training else 1)
    weight_flops = exact - attn
    return {
        "rule": f"{per}ND",
        "N": N,
        "D": D,
        "value": rule,
        "exact_matmul": exact,
        "ratio_exact_over_rule": exact / rule if rule else None,
        "attention_score_flops": attn,
        "weight_matmul_flops": weight_flops,
        "tied_head_flops": tied_head,
        "explanation": (
            f"exact - rule = {exact - rule:+,} FLOPs: QK^T and AV add {attn:,} (no weights, grow with sequence)"
            + (f"; the tied LM head adds {tied_head:,} (its weights are counted as embedding, outside N)" if tied_head else "")
            + f"; the remaining weight matmuls give {weight_flops - tied_head:,} vs {rule:,} for {per} x N x D "
            "(biases, norms and relative-position tables do no matmul; decode skips the encoder; a pooler runs on one row)"
            + ("; with checkpointing the recomputed forward adds one more forward's worth" if w.checkpointing else "")
        ),
    }
