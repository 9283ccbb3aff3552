"""Arguments, loaders and the console shared by `tformer count` and `tformer scale` (not a command itself).
Numbers are formatted by tformer.core.fmt."""

from __future__ import annotations

import sys
from pathlib import Path

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds
from tformer.cost.layout import Layout, parse_zero
from tformer.cost.ledger import Workload
from tformer.cost.parallel import parallel_summary
from tformer.data.gguf_models import PACKAGED_GGUF
from tformer.interop import load_config as load
from tformer.machine import resolve_hardware
from tformer.machine.links import LINKS, link_bandwidth


def add_model_arguments(parser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--preset", help="preset name (see `tformer presets`); default char-small")
    src.add_argument("--config", metavar="FILE", help="a tformer config JSON (or a Hugging Face config.json)")
    src.add_argument("--hf", metavar="DIR", help="a Hugging Face model directory (reads its config.json)")
    src.add_argument("--gguf", metavar="FILE|NAME",
                     help="a GGUF file, or a packaged one (smollm2-135m-instruct): its metadata, not its weights")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    g = parser.add_argument_group("attention kind (long context; each flag sets the config field named after it)")
    g.add_argument("--attn", metavar="KIND", help=f"attention kind (attn_impl): {', '.join(ATTN_KINDS)}")
    for flag, field_name, text in _ATTN_FLAGS:
        g.add_argument(flag, type=int, metavar="N", dest=field_name, help=f"{text} ({field_name})")


_ATTN_FLAGS = (
    ("--window", "attn_window", "keys in each query's window: sliding, strided, longformer"),
    ("--dilation", "attn_dilation", "gap between window keys"),
    ("--global-tokens", "attn_global", "leading tokens that see and are seen by all: longformer, bigbird"),
    ("--block", "attn_block", "tile / chunk / block / bucket size: tiled, chunked, bigbird, lsh"),
    ("--random-blocks", "attn_random", "random key blocks per query block: bigbird"),
    ("--features", "attn_features", "random features: performer"),
    ("--proj", "attn_proj", "projected length k: linformer"),
    ("--hashes", "attn_hashes", "hash rounds: lsh"),
)


def attention_overrides(args) -> list[str]:
    """The --attn flags as config overrides (``key=value``), after any --set."""
    out = [] if getattr(args, "attn", None) is None else [f"attn_impl={args.attn}"]
    for _, field_name, _ in _ATTN_FLAGS:
        value = getattr(args, field_name, None)
        if value is not None:
            out.append(f"{field_name}={value}")
    return out


# Sequences, tokens and devices: far past any machine, and every product the ledger forms of them stays inside
# its own limit (tformer.cost.ledger.MAX_COUNT), so no float made from them overflows.
MAX_SIZE = 10 ** 15
_SIZE = Bounds(1, MAX_SIZE, integer=True)
# Ranges of the flags count and scale share (see tformer/cli/_checks.py); each command's NUMBERS merges them.
WORKLOAD_NUMBERS = {
    "batch": _SIZE, "seq": _SIZE, "seq_decoder": _SIZE, "context": Bounds(0, MAX_SIZE, integer=True),
    # Below a millionth of the roofs, predicted times only measure the flag, not the model.
    "efficiency": Bounds(1e-6, 1, note="the fraction of the roofs reached; 1 is the ideal roofline"),
    "loss_chunk": Bounds(0, MAX_SIZE, integer=True),
    **{name: Bounds(0 if name in ("attn_global", "attn_random") else 1, MAX_SIZE, integer=True)
       for _, name, _ in _ATTN_FLAGS},
}
LAYOUT_NUMBERS = {
    "devices": _SIZE, "tp": _SIZE, "pp": _SIZE, "micro_batches": _SIZE,
    "link_latency": Bounds(0, 1e9, note="microseconds per collective call"),
}


def add_workload_arguments(parser) -> None:
    parser.add_argument("--phase", default="forward", choices=["forward", "train", "prefill", "decode"])
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    parser.add_argument("--seq", type=int, default=None,
                        help="tokens per sequence (encoder-decoder: source length); default the model's max_positions")
    parser.add_argument("--seq-decoder", type=int, default=None, help="encoder-decoder target length (default --seq)")
    parser.add_argument("--context", type=int, default=None, help="decode: tokens already in the KV cache (default seq - 1)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16", "int8"],
                        help="weights (and activations; int8 = weights only, fp16 activations)")
    parser.add_argument("--optimizer", default="adamw", choices=["sgd", "momentum", "adam", "adamw"])
    parser.add_argument("--mixed-precision", action="store_true", help="16-bit compute with an fp32 master copy")
    parser.add_argument("--fp32-grads", action="store_true", help="mixed precision: keep gradients in fp32")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing (recompute each layer)")
    parser.add_argument("--attention-flops", default="full", choices=["full", "causal"],
                        help="full s x s (FlopCounterMode; default) or only causal query-key pairs (labelled)")
    parser.add_argument("--fused-attention", action="store_true", help="no materialised s x s score matrix (flash)")
    parser.add_argument("--loss-chunk", type=int, default=0, metavar="ROWS",
                        help="train: the LM loss forms its logits ROWS positions at a time, forward and backward "
                             "(`tformer train --loss-chunk`); default 0: all at once")
    parser.add_argument("--hardware", metavar="NAME|FILE", help="device from the spec table, a JSON file, or 'measured'")
    parser.add_argument("--efficiency", type=float, default=1.0, help="fraction of the roofs reached (default 1: ideal)")
    parser.add_argument("--json", action="store_true", help="machine-readable output with exact integers")


def add_layout_arguments(parser, devices: bool = True) -> None:
    """Flags of a layout over several devices (``devices``: False where the command has its own --devices)."""
    g = parser.add_argument_group("beyond one device (data x tensor x pipeline parallelism, ZeRO)")
    if devices:
        g.add_argument("--devices", type=int, default=1, help="devices in all; data parallelism = devices / (tp x pp)")
    g.add_argument("--zero", default="0", metavar="STAGE",
                   help="ZeRO stage 0-3, or FSDP's name: no_shard (0), shard_grad_op (2), full_shard (3)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (Megatron-LM column/row split)")
    g.add_argument("--pp", type=int, default=1, help="pipeline stages")
    g.add_argument("--micro-batches", type=int, default=1, help="micro-batches per step in the pipeline")
    g.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b",
                   help="pipeline schedule: 1f1b holds at most P micro-batches' activations, gpipe all M")
    g.add_argument("--sequence-parallel", action="store_true", help="with --tp: split norms and residuals too")
    g.add_argument("--link-bandwidth", metavar="GBPS|LINK",
                   help=f"link between devices, GB/s one way or one of: {', '.join(LINKS)} (default: the device's)")
    g.add_argument("--link-latency", type=float, metavar="US",
                   help="fixed cost of one collective call in microseconds, added per call (default: not counted)")


def load_layout(args, config, workload) -> Layout:
    """The layout the flags describe, checked against the model and workload (one-line errors)."""
    layout = Layout(devices=args.devices, zero=parse_zero(args.zero), tp=args.tp, pp=args.pp,
                    micro_batches=args.micro_batches, sequence_parallel=args.sequence_parallel,
                    schedule=args.schedule)
    layout.check(config, workload)
    return layout


def layout_summary(args, config, workload, layout: Layout, device, roof) -> dict:
    """cost.parallel's summary of ``layout`` with the flags' link, the device's memory and the
    single-device step time of ``roof`` (the roofline on ``device``, or None)."""
    link, source, latency = load_link(args, device)
    single_s = roof.time_s if roof is not None and not isinstance(roof.time_s, str) else None
    par = parallel_summary(config, workload, layout, link, single_s,
                           device.memory_bytes if device is not None else None, latency)
    par["communication"]["link_source"] = source
    return par


def load_link(args, device) -> tuple[float | None, str, float | None]:
    """(bandwidth bytes/s one way, where it comes from, latency seconds per collective call or None)."""
    bandwidth, source = link_bandwidth(args.link_bandwidth, device)
    latency = args.link_latency
    if latency is not None:
        latency = LAYOUT_NUMBERS["link_latency"].check(latency, "--link-latency") * 1e-6
    return bandwidth, source, latency


def load_config(args):

    # A Path, so that --config/--hf never falls back to a preset of the same name.
    path = args.config or args.hf
    if getattr(args, "gguf", None):
        path = args.gguf if args.gguf in PACKAGED_GGUF else Path(args.gguf)
        return load(path, overrides=args.set + attention_overrides(args))
    return load(Path(path) if path else args.preset or "char-small", overrides=args.set + attention_overrides(args))


def load_workload(args, config):
    seq = args.seq if args.seq is not None else config.max_positions
    if args.loss_chunk and args.phase != "train":
        raise TformerError(f"--loss-chunk chunks the training loss's logits; it has no effect on --phase {args.phase}, "
                           "so add --phase train or drop it")
    return Workload(phase=args.phase, batch=args.batch, seq=seq, context=args.context, seq_decoder=args.seq_decoder,
                    dtype=args.dtype, optimizer=args.optimizer, mixed_precision=args.mixed_precision,
                    fp32_grads=args.fp32_grads, checkpointing=args.checkpointing,
                    attention_flops=args.attention_flops, materialize_scores=not args.fused_attention,
                    loss_chunk=args.loss_chunk)


def load_device(spec):
    if not spec:
        return None
    return resolve_hardware(spec)


# Wider than any table tformer prints, so a piped table keeps every cell whole (rich elides to fit the width).
PIPE_WIDTH = 10_000


def console():
    """The rich Console every CLI table goes through. On a terminal, rich's own sizing and colours; piped
    (a file, `less`, a CI log), a width no table reaches so no cell is cut to "pres…", and no control codes."""
    from rich.console import Console  # deferred: --json output never loads rich

    if sys.stdout.isatty():
        return Console()
    return Console(width=PIPE_WIDTH, force_terminal=False, no_color=True)
