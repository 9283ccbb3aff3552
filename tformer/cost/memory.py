"""Memory: weights, gradients, optimizer state, activations, KV cache, logits — each a sum over the
ledger's ops.

Training state per parameter depends on the recipe (DESIGN.md):
  fp32 Adam                                  4 w + 4 g + 4 m + 4 v            = 16 B
  mixed precision Adam, fp32 master, 16-bit grads  2 w + 2 g + 4 master + 4 m + 4 v = 16 B
  mixed precision Adam, fp32 master, fp32 grads    2 w + 4 g + 4 master + 4 m + 4 v = 18 B
  pure 16-bit (no master copy): moments in the weights' dtype.
SGD keeps no state; SGD with momentum one buffer; Adam/AdamW two.

Activations (training, no recomputation) follow Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.1: every op keeps the tensors its backward
needs — norms and matmuls their input, softmax its output, activations their input, dropout a
1-byte mask. For a GPT-style layer with d_ff = 4h, dropout on and 16-bit activations this is their
34·s·b·h + 5·a·s²·b bytes per layer; without dropout it is 32·s·b·h + 2·a·s²·b. A fused
(flash) attention kernel stores no s×s tensor: the s² terms become an fp32 log-sum-exp per row.
Full activation checkpointing keeps each layer's input and recomputes one layer at a time.
"""

from __future__ import annotations

from tformer.cost.ops import kv_cache_bytes
from tformer.cost.quantized import quantized_saving
from tformer.cost.workload import ACTIVATION_BYTES, LOSS_BYTES, WEIGHT_BYTES

# Optimizer-state tensors per parameter, and element-wise FLOPs per parameter of one update
# (a convention: sgd w -= lr*g is 2; momentum adds m = mu*m + g; Adam's m, v, bias corrections,
# sqrt, eps, divide, scale and subtract come to ~12; AdamW's decoupled decay adds 2).
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
OPTIMIZER_FLOPS_PER_PARAM = {"sgd": 2, "momentum": 4, "adam": 12, "adamw": 14}


def optimizer_bytes_per_param(workload) -> dict:
    """Bytes per parameter of each piece of training state for the workload's recipe."""
    w = workload
    weights = WEIGHT_BYTES[w.dtype]
    full = w.dtype == "fp32" or w.mixed_precision
    grads = 4 if (w.dtype == "fp32" or w.fp32_grads) else 2
    master = 4 if w.mixed_precision else 0
    state = 4 if full else weights
    moments = OPTIMIZER_STATES[w.optimizer] * state
    # One update reads the (master) weights, the gradient and the moments, and writes the weights,
    # the moments, and with a master copy the 16-bit weights as well.
    read = (master or weights) + grads + moments
    written = (master or weights) + moments + (weights if master else 0)
    return {"weights": weights, "gradients": grads, "master": master, "moments": moments,
            "total": weights + grads + master + moments, "read": read, "written": written}


def recipe_name(workload) -> str:
    w = workload
    if w.dtype == "fp32":
        return f"fp32 {w.optimizer}"
    if w.mixed_precision:
        return f"mixed precision {w.optimizer} ({w.dtype} weights, fp32 master, {'fp32' if w.fp32_grads else w.dtype} grads)"
    return f"pure {w.dtype} {w.optimizer} (no master copy)"


def activation_bytes(ledger) -> dict:
    """Activation memory from the ops' saved bytes: total and per layer (training), or the peak
    working set of one op (inference: its non-weight inputs and its output; a lower bound)."""
    w = ledger.workload
    fwd = ledger.select(phase="forward")
    if not w.training:
        peak = max((op.bytes_read - op.weight_bytes - op.cache_bytes + op.bytes_written for op in fwd), default=0)
        return {"total": peak, "per_layer": [], "rule": "inference: largest single op's activation inputs + output"}
    per_layer: dict[tuple[str, int], int] = {}
    layer_input: dict[tuple[str, int], int] = {}
    outside = 0
    scores = 0
    for op in fwd:
        scores += op.scores_bytes
        if op.layer is None:
            outside += op.saved_bytes
            continue
        key = (op.stack, op.layer)
        per_layer[key] = per_layer.get(key, 0) + op.saved_bytes
        if key not in layer_input and op.kind == "norm":
            # The layer's input is the first norm's input (pre-LN) or the residual stream (post-LN): rows x d.
            layer_input[key] = op.bytes_written
    rows = [{"stack": s, "layer": i, "bytes": b} for (s, i), b in per_layer.items()]
    if w.checkpointing:
        kept = sum(layer_input.values())
        working = max(per_layer.values(), default=0)  # one layer recomputed at a time
        total = kept + working + outside
        rule = "checkpointing: each layer's input kept, one layer's activations rebuilt at a time"
    else:
        total = sum(per_layer.values()) + outside
        rule = "Korthikanti et al. 2022 accounting: every tensor kept for the backward pass"
    return {"total": total, "per_layer": rows, "outside_layers": outside, "scores": scores, "rule": rule}


LOGIT_KINDS = ("lm_head", "classifier", "temperature")


def logits_bytes(op, workload, softcap: bool = False) -> int:
    """The memory the logits ``op`` writes take: all of them (rows x V), or under a chunked LM loss (training with
    workload.loss_chunk, tformer.model.chunked_loss) one chunk's working set, n = min(chunk, rows) rows: its fp32
    logits, worked on in place (softmax, then their gradient), plus with 16-bit activations the 16-bit logits the
    head writes (forward) and the 16-bit gradient its matmuls read (backward); with a softcap (``softcap``) a second
    fp32 buffer, tanh's output, in the backward instead."""
    w = workload
    if not (w.training and w.loss_chunk and op.kind == "lm_head"):
        return op.bytes_written
    n, V = min(w.loss_chunk, op.dims.m), op.dims.n
    a = ACTIVATION_BYTES[w.dtype]
    per_logit = 2 * LOSS_BYTES if softcap else LOSS_BYTES + (a if a < LOSS_BYTES else 0)
    return n * V * per_logit


def vocabulary_bytes(ledger) -> int:
    """Training memory that grows with tokens x vocabulary: the logits (logits_bytes) and what the loss keeps for its
    backward (fp32 log-probabilities; under a chunked loss each row's log-sum-exp only), with a softcap's saved
    output. Its share of the total is what chunking the loss can take away."""
    kept = sum(op.saved_bytes for op in ledger.select(phase="forward")
               if op.kind == "loss" or op.name.endswith(".softcap"))
    return ledger.memory["logits"] + kept


def memory_breakdown(ledger) -> dict:
    w = ledger.workload
    P, trained = ledger.params["total"], ledger.params["trained"]
    per = optimizer_bytes_per_param(w)
    fwd = ledger.select(phase="forward")
    # Weight-only quantized Linears (config.quantize) hold fewer bytes than the float weights of the rest.
    weights = P * per["weights"] - quantized_saving(ledger.architecture, per["weights"])
    # Only what the loss reaches gets a gradient and optimizer state (not BERT's pooler under MLM).
    gradients = trained * per["gradients"] if w.training else 0
    optimizer = trained * (per["master"] + per["moments"]) if w.training else 0
    acts = activation_bytes(ledger)
    kv = sum(op.cache_bytes for op in fwd)
    # What the loss reads: an LM head's (tokens x vocabulary), a classifier's, CLIP's N x N similarity.
    softcap = bool(getattr(ledger.architecture.lm_head, "softcap", False))
    logits = sum(logits_bytes(op, w, softcap) for op in fwd if op.name == "mlm_head.decoder" or op.kind in LOGIT_KINDS)
    if w.training:
        total = weights + gradients + optimizer + acts["total"] + logits
        total_rule = "weights + gradients + optimizer state + activations + logits"
    else:
        total = weights + kv + acts["total"] + logits
        total_rule = "weights + KV cache + activation working set + logits"
    out = {
        "weights": weights,
        "gradients": gradients,
        "optimizer": optimizer,
        "activations": acts["total"],
        "kv_cache": kv,
        "logits": logits,
        "total": total,
        "total_rule": total_rule,
        "activations_per_layer": acts["per_layer"],
        "activation_rule": acts["rule"],
        "bytes_per_param": {k: per[k] for k in ("weights", "gradients", "master", "moments")} if w.training
        else {"weights": per["weights"]},
        "recipe": recipe_name(w) if w.training else f"{w.dtype} weights, {'fp16' if w.dtype == 'int8' else w.dtype} activations",
        "kv_cache_per_token": _kv_per_token(ledger),
    }
    return out


def _kv_per_token(ledger) -> int:
    """Self-attention KV-cache bytes per cached token per sequence: 2 x layers x kv_heads x head_dim x bytes."""
    if ledger.config.traits.recurrent:
        return 0  # an RNN's state has a fixed size, whatever the tokens read
    c, w = ledger.config, ledger.workload
    layers = sum(len(st.layers) for st in ledger.architecture.stacks if st.causal)  # a bidirectional stack caches nothing
    return 2 * layers * c.n_kv_heads * c.head_dim * ACTIVATION_BYTES[w.dtype]


def korthikanti_activation_bytes(s: int, b: int, h: int, a: int, layers: int = 1) -> float:
    """Korthikanti et al. 2022 eq. (2): s·b·h·L·(34 + 5·a·s/h) bytes (16-bit, dropout, no recomputation)."""
    return s * b * h * layers * (34 + 5 * a * s / h)


def generation_bytes(config, rows: int, tokens: int, prompt: int, *, source: int = 0, use_cache: bool = True,
                     bytes_per: int = 4) -> dict:
    """A lower bound on the memory one `generate` call needs beyond the weights, from the config alone.

    rows: sequences decoded together (batch x beams); tokens: decoder positions at the end (prompt +
    new tokens); prompt: decoder tokens read by the prefill; source: encoder tokens (encoder-decoder).
    The KV cache holds every decoder layer's keys and values for ``tokens`` positions (cross-attention:
    ``source`` positions). The largest forward pass holds one layer's activations and attention
    scores: the prefill with a cache, the whole sequence at the last step without one. The search keeps
    a few (rows, vocabulary) tensors (logits, log-probabilities, candidates) and each row's tokens.
    """
    c = config
    decoder_layers = c.n_decoder_layers if c.traits.seq2seq else c.n_layers
    kv = kv_cache_bytes(decoder_layers, tokens + source, c.n_kv_heads, c.head_dim, rows, bytes_per) if use_cache else 0
    queries = prompt if use_cache else tokens
    keys = tokens + source
    width = max(c.d_ff, 3 * c.n_heads * c.head_dim, c.d_model)
    forward = rows * (queries * width + c.n_heads * queries * keys) * bytes_per
    if c.traits.seq2seq:  # the encoder's output stays for every row; its own pass scores source x source
        forward += rows * source * (c.d_model + c.n_heads * source) * bytes_per
    search = rows * (3 * c.vocab_size * 4 + 3 * tokens * 8)
    return {"kv_cache": kv, "forward": forward, "search": search, "total": kv + forward + search}
