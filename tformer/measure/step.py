"""One step of a real model for a workload: forward, train (forward + backward + optimizer), prefill,
or one decode step at a fixed context. Random weights and random token ids: time and FLOPs do not
depend on the values (dropout aside, which follows the config in training, as the ledger does).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch

from tformer.core.errors import TformerError
from tformer.cost.attention import costed_kind
from tformer.cost.ledger import ledger
from tformer.cost.roofline import roofline
from tformer.data.batch import example_batch
from tformer.model import build
from tformer.model.path_choice import choose_paths
from tformer.model.runners import runner_for

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _optimizer(params, name: str):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "momentum":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9)
    return torch.optim.SGD(params, lr=1e-4)


class StepRunner:
    """Builds the model and inputs once; ``step(timeline)`` runs one step, marking phases when given.

    The optimizer is split into one instance per ledger op that owns parameters, so its step can be
    timed op by op; stepping them back to back is the same arithmetic as one optimizer over all.
    """

    def __init__(self, config, workload, device: str = "cpu", seed: int = 0):
        w = workload
        self.config, self.workload, self.device = config, w, device
        self.check(config, w)
        torch.manual_seed(seed)
        # The kind the ledger costs: the default exact pair runs as the reference (explicit matmul,
        # softmax, matmul, what the ledger lists); any other kind runs as itself.
        self.model = build(config.replace(attn_impl=costed_kind(config, w)), device=device, dtype=TORCH_DTYPES[w.dtype])
        self.model.train(w.phase == "train")
        self.runner = runner_for(self.model)
        if w.phase != "train":  # each Linear's path, chosen before the step that is timed (train: autograd's own)
            choose_paths(self.model)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        V = config.vocab_size
        ids = torch.randint(0, V, (w.batch, w.seq), generator=gen).to(device)
        seq_dec = w.seq_decoder or w.seq
        dec_ids = torch.randint(0, V, (w.batch, seq_dec), generator=gen).to(device)
        self.batch = example_batch(config, ids, dec_ids)
        # What the decoder reads, and the source a seq2seq model's encoder reads besides.
        self.source = ids if self.runner.takes_source else None
        self.target = dec_ids if self.runner.takes_source else ids
        self.optimizers = []
        self.cache = None
        if w.phase == "train":
            self._build_optimizers()
        if w.phase == "decode":
            self._prefill_for_decode(gen)

    @staticmethod
    def check(config, w) -> None:
        """Reject what this runner cannot run, before anything slow happens."""
        if w.dtype not in TORCH_DTYPES:
            raise TformerError(f"profile runs fp32, bf16 or fp16 models; {w.dtype} is a weights-only format it "
                               "does not execute (use `tformer count` for its prediction)")
        if w.mixed_precision or w.checkpointing:
            raise TformerError("profile measures plain single-dtype steps; mixed precision and activation "
                               "checkpointing are predicted by `tformer count`, not measured here")
        if w.phase not in config.traits.phases:
            raise TformerError(f"{w.phase} needs a decoder; an encoder-only model ({config.name}) has no KV cache "
                               "or generation (use --phase forward or train)")
        if not w.materialize_scores and config.attn_impl in ("sdpa", "reference"):
            raise TformerError("profile runs the reference attention (materialised scores), which the measured "
                               "FLOPs are checked against; drop --fused-attention")
        positions = (w.context if w.context is not None else w.seq - 1) + 1 if w.phase == "decode" else max(
            w.seq, w.seq_decoder or 0)
        if config.position in ("learned", "sinusoidal") and positions > config.max_positions:
            raise TformerError(f"{positions} positions exceed the model's max_positions={config.max_positions}; "
                               "lower --seq or --context")

    # Setup ---------------------------------------------------------------------------------------
    def _build_optimizers(self) -> None:
        modules = dict(self.model.named_modules())
        seen: set[int] = set()
        for op in ledger(self.config, self.workload).select(phase="optimizer"):
            module = modules.get(op.name)
            params = [p for p in (module.parameters(recurse=False) if module is not None else []) if id(p) not in seen]
            seen.update(id(p) for p in params)
            if params:
                self.optimizers.append((op.name, _optimizer(params, self.workload.optimizer)))
        rest = [p for p in self.model.parameters() if id(p) not in seen]
        if rest:  # parameters the ledger does not name (none expected): stepped, charged to no op
            self.optimizers.append((None, _optimizer(rest, self.workload.optimizer)))

    def _prefill_for_decode(self, gen) -> None:
        """Fill a KV cache with ``context`` tokens (untimed), one more position reserved; each timed step then
        decodes position ``context`` in place and rewinds, so every step sees the same context."""
        w, c = self.workload, self.config
        ctx = w.decode_context
        self.next_ids = torch.randint(0, c.vocab_size, (w.batch,), generator=gen).to(self.device)
        with torch.no_grad():
            self.cache = self.runner.new_cache(w.batch, ctx + 1)
            prompt = torch.randint(0, c.vocab_size, (w.batch, ctx), generator=gen).to(self.device)
            self.runner.prefill(self.cache, prompt, source=self.source)

    # The step --------------------------------------------------------------------------------------
    def step(self, timeline=None) -> None:
        phase = self.workload.phase
        if phase == "train":
            self._train(timeline)
        else:
            with torch.no_grad():
                if timeline is not None:
                    timeline.begin("forward")
                self._infer()
                if timeline is not None:
                    timeline.end()

    def _infer(self) -> None:
        phase = self.workload.phase
        if phase == "decode":
            # An RNN's cache is its state, held by the cache record itself (no KV cache).
            kv = self.cache.kv if self.cache.kv is not None else self.cache
            # A recurrent state (linear attention, Performer, an RNN) cannot forget a position: put it back instead.
            saved = kv.snapshot() if kv.recurrent else None
            self.runner.step(self.cache, self.next_ids)
            if saved is not None:
                kv.restore(saved)
            else:
                self.cache.rewind(1)  # the next step overwrites position ``context`` again
        elif phase == "prefill":
            cache = self.runner.new_cache(self.workload.batch)
            self.runner.prefill(cache, self.target, source=self.source, all_logits=True)
        else:
            self.runner.forward(self.batch)

    def _train(self, timeline) -> None:
        if timeline is not None:
            timeline.begin("forward")
        # An encoder without an MLM head scores nothing: backpropagate from its outputs instead.
        loss = self.runner.loss(self.batch, stand_in=True)
        if timeline is not None:
            timeline.end()
            timeline.begin("backward")
        loss.backward()
        if timeline is not None:
            timeline.end()
            timeline.begin("optimizer")
        for name, opt in self.optimizers:
            if timeline is not None and name is not None:
                timeline.mark("pre", name)
            opt.step()
            if timeline is not None and name is not None:
                timeline.mark("post", name)
        if timeline is not None:
            timeline.end()
        for _, opt in self.optimizers:
            opt.zero_grad(set_to_none=True)


def skeleton(config, workload):
    """The same architecture and phase at a width and length where arithmetic and bytes vanish:
    8-wide heads, batch 1, at most 16 tokens. What is left of its step time is the glue."""
    d = 8 * config.n_heads
    vocab = min(config.vocab_size, 256)
    ids = {k: (None if v is None else min(v, vocab - 1)) for k, v in
           (("pad_token_id", config.pad_token_id), ("bos_token_id", config.bos_token_id),
            ("eos_token_id", config.eos_token_id), ("decoder_start_token_id", config.decoder_start_token_id))}
    small = config.replace(d_model=d, head_dim=8, d_ff=4 * d, vocab_size=vocab, **ids)
    if config.traits.images:  # at most 3 x 3 patches (10 tokens) of the same size; CLIP's vision tower as thin
        small = small.replace(image_size=config.patch_size * min(config.image_size // config.patch_size, 3))
        if config.traits.two_towers:
            dv = 8 * config.vision_n_heads
            small = small.replace(vision_d_model=dv, vision_d_ff=4 * dv)
    short = min(workload.seq, 16)
    work = replace(workload, batch=1, seq=short,
                   seq_decoder=None if workload.seq_decoder is None else min(workload.seq_decoder, 16),
                   context=None if workload.context is None else min(workload.context, short - 1))
    return small, work


def time_skeleton(config, workload, device: str = "cpu", steps: int = 15, warmup: int = 3):
    """Median seconds per step of the model's skeleton (``skeleton``), about 2 s of timing at most.

    Returns (skeleton config, its workload, median seconds, steps timed)."""
    small, work = skeleton(config, workload)
    runner = StepRunner(small, work, device=device)
    for _ in range(max(warmup, 1)):
        t0 = time.perf_counter()
        runner.step()
    steps = max(5, min(steps, int(2.0 / max(time.perf_counter() - t0, 1e-6))))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        runner.step()
        times.append(time.perf_counter() - t0)
    return small, work, statistics.median(times), steps


def framework_overhead(config, workload, device: str, hw, steps: int = 15, warmup: int = 3) -> tuple[float, str]:
    """Measured seconds per ledger op that this model's step spends outside arithmetic and memory
    traffic: Python, module calls, the dispatcher, views, cache bookkeeping, thread wake-ups,
    autograd and optimizer bookkeeping in training. Far more than one bare op call (a decode step
    of GPT-2 makes about 15 framework calls per ledger op), and it depends on the phase.

    How: time the model's skeleton (same layers and phase, 8-wide heads, batch 1, a few tokens),
    subtract its own roofline prediction (near zero), and share the rest over its ledger ops, whose
    count equals the full model's. Returns (seconds per op, how it was measured).
    """

    small, work, step, steps = time_skeleton(config, workload, device, steps, warmup)
    lg = ledger(small, work)
    roof = roofline(lg, replace(hw, call_overhead_s=None)).time_s
    roof = roof if isinstance(roof, float) else 0.0  # a device without known roofs: all of it is glue
    per_op = max(step - roof, 0.0) / max(len(lg.ops), 1)
    how = (f"{per_op * 1e6:.1f} µs per op: the model's skeleton (same layers and phase; d_model {small.d_model}, "
           f"batch 1, {work.seq} tokens) took {step * 1e3:.2f} ms per step (median of {steps}) for "
           f"{len(lg.ops)} ledger ops, its arithmetic and bytes predicted at {roof * 1e3:.3f} ms")
    return per_op, how


__all__ = ["TORCH_DTYPES", "StepRunner", "framework_overhead", "skeleton", "time_skeleton"]
