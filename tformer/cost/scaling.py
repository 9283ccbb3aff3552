"""What-ifs and scaling: how costs move when the model or workload grows, where attention overtakes
the FFN, when decoding turns compute-bound, what training N tokens costs, and the compute-optimal
model size for a budget (Kaplan et al. 2020; Hoffmann et al. 2022).

Everything model-specific is read off ledgers, so it agrees with the op list by construction.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

from tformer.core.errors import TformerError
from tformer.cost.architecture import describe
from tformer.cost.ledger import Workload, ledger
from tformer.cost.memory import activation_bytes
from tformer.cost.roofline import COMPUTE_DTYPE, roofline

PF_DAY = 1e15 * 86400  # FLOPs in one petaflop/s-day (Kaplan et al.'s compute unit)

# Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 6.1 / Figure 14:
# compute-efficient non-embedding size N_opt = 1.3e9 * (C_min / PF-day)^0.73.
KAPLAN_N_COEFF = 1.3e9
KAPLAN_N_EXPONENT = 0.73

# Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models": the rule of thumb
# D = 20 N with C = 6 N D, and the approach-3 fit L(N, D) = E + A / N^alpha + B / D^beta (eq. 10).
CHINCHILLA_TOKENS_PER_PARAM = 20
CHINCHILLA_FIT = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


# Activation memory under each remedy ------------------------------------------------------------
def activation_alternatives(config, workload) -> dict:
    """Training activation bytes with and without checkpointing and a materialised s x s score matrix."""
    if not workload.training:
        return {}
    out = {}
    for ckpt in (False, True):
        for scores in (True, False):
            w = replace(workload, checkpointing=ckpt, materialize_scores=scores)
            key = f"{'checkpointing' if ckpt else 'no_checkpointing'}/{'scores' if scores else 'fused_attention'}"
            out[key] = activation_bytes(ledger(config, w))["total"]
    return out


# What-if table ------------------------------------------------------------------------------------------
WHAT_IF_KNOBS = ("d_model", "n_layers", "seq", "batch")


def check_factor(factor: float) -> None:
    """A what-if factor is a finite positive number (inf or nan would reach int() as a size)."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
        raise TformerError(f"the scaling factor must be a finite positive number, got {factor!r}; e.g. 2 or 0.5")


def scaled_config(config, knob: str, factor: float):
    """``config`` with d_model (and d_ff, and head_dim when set explicitly) or the layer count scaled."""
    check_factor(factor)

    def scale(v):
        out = v * factor
        if abs(out - round(out)) > 1e-9 or round(out) < 1:
            raise TformerError(f"{knob}={v} x {factor} is not a whole number; pick a factor that keeps sizes whole")
        return int(round(out))

    if knob == "d_model":
        changes = {"d_model": scale(config.d_model), "d_ff": scale(config.d_ff)}
        if config.head_dim is not None:
            changes["head_dim"] = scale(config.head_dim)
        return config.replace(**changes)
    if knob == "n_layers":
        changes = {"n_layers": scale(config.n_layers)}
        if config.n_decoder_layers is not None:
            changes["n_decoder_layers"] = scale(config.n_decoder_layers)
        for name in ("layer_types", "attn_dilation"):  # a per-layer list keeps its pattern (Gemma's 5 local : 1 global)
            per_layer = getattr(config, name)
            if isinstance(per_layer, list):
                changes[name] = [per_layer[i % len(per_layer)] for i in range(changes["n_layers"])]
        return config.replace(**changes)
    raise TformerError(f"unknown model knob '{knob}'")


def what_if(config, workload: Workload, factor: float = 2.0, device=None, efficiency: float = 1.0,
            knobs: tuple[str, ...] = WHAT_IF_KNOBS) -> dict:
    """How params, FLOPs, activation memory, KV cache and predicted time change when each knob is
    multiplied by ``factor`` (the others held). Sequence growth beyond a learned/sinusoidal table
    grows the table too (max_positions), so the comparison stays possible."""

    def measure(c, w):
        lg = ledger(c, w)
        m = lg.memory
        t = roofline(lg, device, efficiency).time_s if device is not None else None
        return {"params": lg.params["total"], "flops": lg.flops["total"], "flops_matmul": lg.flops["matmul"],
                "activations": m["activations"], "kv_cache": m["kv_cache"], "memory_total": m["total"], "time_s": t}

    check_factor(factor)
    base = measure(config, workload)
    rows = []
    for knob in knobs:
        c, w = config, workload
        if knob in ("d_model", "n_layers"):
            c = scaled_config(config, knob, factor)
        elif knob == "image_size":  # an image model's tokens: (image_size / patch_size)^2 + 1
            c = _scaled_image(config, factor)
        elif knob in ("seq", "batch"):
            if knob == "seq" and config.traits.images and config.arch == "vit":
                raise TformerError("a ViT reads no token sequence: its tokens are (image_size / patch_size)^2 + 1; "
                                   "use the knob image_size instead of seq")
            value = getattr(workload, knob) * factor
            if abs(value - round(value)) > 1e-9 or round(value) < 1:
                raise TformerError(f"{knob}={getattr(workload, knob)} x {factor} is not a whole number")
            w = replace(workload, **{knob: int(round(value))})
            if knob == "seq" and workload.seq_decoder is not None:
                w = replace(w, seq_decoder=int(round(workload.seq_decoder * factor)))
            if knob == "seq" and workload.context is not None:
                w = replace(w, context=int(round(workload.context * factor)))
            need = max(w.seq, w.seq_decoder or 0, (w.decode_context + 1) if w.phase == "decode" else 0)
            if config.position in ("learned", "sinusoidal") and need > config.max_positions:
                c = config.replace(max_positions=need)
        else:
            raise TformerError(f"unknown what-if knob '{knob}'; choose from {', '.join(WHAT_IF_KNOBS + ('image_size',))}")
        new = measure(c, w)
        ratios = {k: (new[k] / base[k] if isinstance(new[k], (int, float)) and isinstance(base[k], (int, float)) and base[k]
                      else None) for k in base}
        rows.append({"knob": knob, "factor": factor, "values": new, "ratios": ratios})
    return {"base": base, "rows": rows}


def _scaled_image(config, factor: float):
    """``config`` with its image side x factor (tokens ~ x factor^2), which must stay whole patches."""
    if not config.traits.images:
        raise TformerError(f"the knob image_size applies to image models (vit, clip); {config.traits.label} reads text")
    side = config.image_size * factor
    if abs(side - round(side)) > 1e-9 or round(side) % config.patch_size or round(side) < config.patch_size:
        raise TformerError(f"image_size={config.image_size} x {factor} = {side:g} pixels is not whole "
                           f"{config.patch_size}-pixel patches; pick a factor that keeps it a multiple of the patch size")
    return config.replace(image_size=round(side))


def default_knobs(config) -> tuple[str, ...]:
    """The what-if knobs for ``config``: an image model's length knob is its image size, a ViT's only one."""
    if config.arch == "vit":
        return ("d_model", "n_layers", "image_size", "batch")
    if config.traits.images:
        return ("d_model", "n_layers", "seq", "image_size", "batch")
    return WHAT_IF_KNOBS


# Attention vs FFN --------------------------------------------------------------------------------------------
def attention_crossover(config) -> dict:
    """Sequence lengths at which attention's s² work (QK^T + AV, per token) overtakes
    (a) the FFN matmuls and (b) the attention projections (q, k, v, o), in a self-attention layer
    of the first stack. Read off two ledgers: per-token costs are linear in s, so two points fix them."""
    stack = describe(config).stacks[0].name

    def per_token(seq: int) -> dict[str, Fraction]:
        c, n = config, seq
        if config.traits.images and stack != "text":  # the first stack reads images: seq patches per side
            c = config.replace(image_size=config.patch_size * seq)
            n = c.image_tokens
        lg = ledger(c, Workload(phase="forward", batch=1, seq=seq))
        ops = lg.select(phase="forward", layer=0, stack=stack)
        pick = lambda kinds: sum(op.matmul_flops for op in ops if op.kind in kinds and ".cross_attn." not in op.name)
        return {"n": n, "scores": Fraction(pick(("scores", "context")), n),
                "ffn": Fraction(pick(("ffn_up", "ffn_gate", "ffn_down")), n),
                "proj": Fraction(pick(("qkv_proj", "out_proj")), n)}

    # Probe at short lengths (always inside any position table), then solve the linear relations.
    a, b = per_token(1), per_token(2)
    slope = (b["scores"] - a["scores"]) / (b["n"] - a["n"])  # FLOPs per token per extra key
    intercept = a["scores"] - slope * a["n"]
    out = {}
    for name, key in (("vs_ffn", "ffn"), ("vs_projections", "proj")):
        target = a[key]
        s = (target - intercept) / slope
        out[name] = int(s) if s.denominator == 1 else float(s)
    out["note"] = ("per layer, per token: QK^T + AV cost 4·s·n_heads·head_dim FLOPs; the FFN 2·(2 or 3)·d·d_ff; "
                   "the projections 4·d·(n_heads + n_kv_heads)·head_dim")
    return out


# Decode ------------------------------------------------------------------------------------------------------------
def decode_curve(config, contexts, batch: int = 1, dtype: str = "fp16", device=None, efficiency: float = 1.0) -> list[dict]:
    """Cost of one decode step at each context n: FLOPs grow as O(b·d² + b·n·d), bytes as weights + KV cache."""

    rows = []
    for n in contexts:
        lg = ledger(config, Workload(phase="decode", batch=batch, seq=n + 1, context=n, dtype=dtype))
        fwd = lg.select(phase="forward")
        row = {"context": n, "flops": lg.flops["total"], "flops_matmul": lg.flops["matmul"],
               "bytes": sum(op.bytes for op in fwd), "kv_cache": lg.memory["kv_cache"]}
        if device is not None:
            row["time_s"] = roofline(lg, device, efficiency).time_s
        rows.append(row)
    return rows


def decode_compute_bound_batch(config, context: int, device, dtype: str = "fp16") -> dict:
    """The smallest batch at which one decode step's total intensity reaches the device's ridge point.

    A decode step reads the weights once (independent of batch) and each sequence's KV cache; its
    FLOPs grow with batch. So FLOPs = b·f and bytes = W + b·m; compute-bound when
    b·f / (W + b·m) >= ridge, i.e. b >= ridge·W / (f - ridge·m). If f <= ridge·m (the KV-cache reads
    alone outgrow the compute), no batch makes it compute-bound.
    """

    peak, bw = device.peak(COMPUTE_DTYPE[dtype]), device.bandwidth
    if not peak or not bw:
        return {"batch": "unknown", "reason": f"{device.name}: peak or bandwidth unknown"}
    ridge = Fraction(peak) / Fraction(bw)

    def totals(b):
        lg = ledger(config, Workload(phase="decode", batch=b, seq=context + 1, context=context, dtype=dtype))
        fwd = lg.select(phase="forward")
        return sum(op.flops for op in fwd), sum(op.bytes for op in fwd)

    f1, by1 = totals(1)
    f2, by2 = totals(2)
    f, m = f2 - f1, by2 - by1  # per-sequence FLOPs and bytes
    W = by1 - m  # batch-independent bytes (the weights)
    denom = f - ridge * m
    if denom <= 0:
        return {"batch": None, "ridge_point": float(ridge),
                "reason": "per-sequence KV-cache and activation reads keep the step memory-bound at any batch"}
    b = ridge * W / denom
    batch = int(b) if b.denominator == 1 else int(b) + 1
    return {"batch": max(batch, 1), "ridge_point": float(ridge), "flops_per_sequence": f,
            "bytes_per_sequence": m, "weight_bytes": W}


# Training time, cost and rules --------------------------------------------------------------------------------------
def training_flops_6nd(n_params: float, tokens: float) -> float:
    """Training compute by the rule of thumb: 6 FLOPs per parameter per token (2 forward, 4 backward)."""
    return 6 * n_params * tokens


def total_training_flops(steps: int, batch: int, flops_per_sequence: float) -> float:
    return steps * batch * flops_per_sequence


def training_steps(tokens: float, batch: int, seq: int) -> float:
    """Optimizer steps to consume ``tokens`` at ``batch`` sequences of ``seq`` tokens per step."""
    return tokens / (batch * seq)


def training_tokens_per_second(n_params: float, peak_flops: float, utilization: float, devices: int = 1) -> float:
    """Throughput at 6 FLOPs per parameter per token."""
    return devices * utilization * peak_flops / (6 * n_params)


def _positive(what: str, value: float, zero_ok: bool = False) -> float:
    """``value`` if it is a finite number above zero (or zero, with ``zero_ok``); else one TformerError.
    NaN fails every comparison, so a plain ``value <= 0`` test would let it through."""
    if not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
        raise TformerError(f"{what} must be a finite {'non-negative' if zero_ok else 'positive'} number, got {value}")
    return value


def training_time(total_flops: float, peak_flops: float, utilization: float, devices: int = 1) -> float:
    """Wall-clock seconds for ``total_flops`` on ``devices`` devices at ``utilization`` of their peak."""
    if not 0 < utilization <= 1:
        raise TformerError(f"utilization must be in (0, 1], got {utilization}")
    if devices < 1:
        raise TformerError(f"devices must be at least 1, got {devices}")
    return total_flops / (devices * peak_flops * utilization)


def training_run(config, tokens: float, devices: int, utilization: float, peak_flops: float,
                 batch: int = 1, seq: int = 1024, price_per_device_hour: float | None = None,
                 workload: Workload | None = None) -> dict:
    """Time (and cost) to train ``config`` on ``tokens`` tokens: exact step FLOPs from the ledger,
    times the number of steps, at ``utilization`` of ``peak_flops`` on ``devices`` devices."""
    _positive("training tokens", tokens)
    if price_per_device_hour is not None:
        _positive("price per device-hour", price_per_device_hour, zero_ok=True)
    w = workload or Workload(phase="train", batch=batch, seq=seq)
    lg = ledger(config, w)
    per_token = lg.flops["matmul"] / lg.tokens
    total = per_token * tokens
    seconds = training_time(total, peak_flops, utilization, devices)
    out = {"tokens": tokens, "flops": total, "flops_per_token": per_token,
           "flops_6nd": training_flops_6nd(lg.params["non_embedding"], tokens),
           "devices": devices, "seconds": seconds, "device_hours": seconds * devices / 3600}
    if price_per_device_hour is not None:
        out["cost"] = out["device_hours"] * price_per_device_hour
    return out


def generation_flops_no_cache(n_params: float, prompt: int, new_tokens: int) -> float:
    """Without a KV cache every step re-runs the whole prefix: sum over t of 2·P·(prompt + t)."""
    return sum(2 * n_params * (prompt + t) for t in range(1, new_tokens + 1))


def generation_flops_with_cache(n_params: float, prompt: int, new_tokens: int) -> float:
    """With a KV cache the prompt is processed once and each new token once (weight FLOPs only)."""
    return 2 * n_params * (prompt + new_tokens)


def kv_cache_speedup(n: int) -> float:
    """Token passes to generate n tokens without a cache (1 + 2 + ... + n) over with one (n)."""
    return (n * (n + 1) / 2) / n


def checkpointing_overhead(forward: float = 1.0, backward: float = 2.0, recompute_fraction: float = 1.0) -> float:
    """Step-time factor when ``recompute_fraction`` of the forward pass is recomputed in backward."""
    return (forward + backward + recompute_fraction * forward) / (forward + backward)


# Compute-optimal sizes ---------------------------------------------------------------------------------------------------
def chinchilla_optimal(compute: float, tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM) -> dict:
    """N and D for a compute budget with C = 6·N·D and D = tokens_per_param·N (Hoffmann et al. 2022)."""
    _positive("compute budget (FLOPs)", compute)
    n = (compute / (6 * tokens_per_param)) ** 0.5
    return {"params": n, "tokens": tokens_per_param * n, "rule": f"C = 6ND, D = {tokens_per_param}N"}


def chinchilla_optimal_fit(compute: float, fit: dict = CHINCHILLA_FIT) -> dict:
    """N and D minimising E + A/N^alpha + B/D^beta subject to C = 6ND (Hoffmann et al. 2022, eq. 4 with
    the approach-3 constants): N_opt = G·(C/6)^(beta/(alpha+beta)), D_opt = (C/6)/N_opt,
    G = (alpha·A / (beta·B))^(1/(alpha+beta))."""
    _positive("compute budget (FLOPs)", compute)
    A, B, a, b = fit["A"], fit["B"], fit["alpha"], fit["beta"]
    G = (a * A / (b * B)) ** (1 / (a + b))
    n = G * (compute / 6) ** (b / (a + b))
    d = compute / 6 / n
    loss = fit["E"] + A / n**a + B / d**b
    return {"params": n, "tokens": d, "loss": loss, "rule": "Hoffmann et al. 2022 approach 3 fit"}


def kaplan_optimal(compute: float) -> dict:
    """Kaplan et al. 2020: N_opt = 1.3e9 · (C / PF-day)^0.73 non-embedding parameters; tokens from C = 6ND."""
    _positive("compute budget (FLOPs)", compute)
    n = KAPLAN_N_COEFF * (compute / PF_DAY) ** KAPLAN_N_EXPONENT
    return {"params": n, "tokens": compute / (6 * n), "rule": "Kaplan et al. 2020, N = 1.3e9 (C/PF-day)^0.73"}
