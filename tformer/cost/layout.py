"""A layout of devices: N = D data-parallel replicas x T tensor-parallel ranks x P pipeline stages,
with a ZeRO stage over the replicas, and the checks that say which layouts cannot exist."""

from __future__ import annotations

from dataclasses import dataclass

from tformer.core.errors import TformerError

ZERO_ALIASES = {"no_shard": 0, "shard_grad_op": 2, "full_shard": 3}  # FSDP's names for stages 0, 2, 3
MAX_DEVICES = 1 << 20
_PIPELINES = ("1f1b", "gpipe")


def parse_zero(value) -> int:
    """0-3, or FSDP's name for one; anything else is one TformerError naming the choices."""
    text = str(value).strip().lower()
    if text in ZERO_ALIASES:
        return ZERO_ALIASES[text]
    if text in ("0", "1", "2", "3"):
        return int(text)
    raise TformerError(f"--zero {value!r} is not a ZeRO stage; choose 0, 1, 2 or 3 "
                       f"(or FSDP's {', '.join(f'{k} = {v}' for k, v in ZERO_ALIASES.items())})")


@dataclass(frozen=True)
class Layout:
    devices: int = 1
    zero: int = 0
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    sequence_parallel: bool = False
    schedule: str = "1f1b"

    @property
    def dp(self) -> int:
        return self.devices // (self.tp * self.pp)

    @property
    def single(self) -> bool:
        return self.devices == 1

    def describe(self) -> str:
        parts = [f"{self.devices} device{'s' if self.devices != 1 else ''}: data {self.dp}"]
        if self.tp > 1:
            parts.append(f"tensor {self.tp}{' + sequence' if self.sequence_parallel else ''}")
        if self.pp > 1:
            parts.append(f"pipeline {self.pp} ({self.micro_batches} micro-batch{'es' if self.micro_batches != 1 else ''}, {self.schedule})")
        if self.zero:
            parts.append(f"ZeRO-{self.zero}")
        return ", ".join(parts)

    def check(self, config, workload) -> None:
        """One TformerError naming the first thing about this layout that cannot exist."""
        for name in ("devices", "tp", "pp", "micro_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                flag = "--" + name.replace("_", "-")
                raise TformerError(f"{flag} must be a whole number of at least 1, got {value!r}")
        if self.devices > MAX_DEVICES:
            raise TformerError(f"--devices {self.devices} is more than {MAX_DEVICES:,}; give a real cluster size")
        if self.zero not in (0, 1, 2, 3):
            raise TformerError(f"--zero {self.zero} is not a ZeRO stage; choose 0, 1, 2 or 3")
        if self.schedule not in _PIPELINES:
            raise TformerError(f"pipeline schedule {self.schedule!r} is unknown; choose {' or '.join(_PIPELINES)}")
        if self.devices % (self.tp * self.pp):
            raise TformerError(f"--devices {self.devices} is not divisible by --tp x --pp = {self.tp * self.pp}; "
                               "data parallelism is devices / (tp x pp) replicas")
        layers = layer_count(config)
        if self.pp > layers:
            raise TformerError(f"--pp {self.pp} is more than the model's {layers} layer{'s' if layers != 1 else ''}; "
                               f"use at most {layers} stage{'s' if layers != 1 else ''}")
        for what, n in (("heads", config.n_heads), ("key/value heads", config.n_kv_heads), ("d_ff", config.d_ff)):
            if n % self.tp:
                raise TformerError(f"the model's {n} {what} are not divisible by --tp {self.tp}; "
                                   f"choose a tensor-parallel size that divides {n}")
        if self.sequence_parallel and self.tp == 1:
            raise TformerError("--sequence-parallel splits what tensor parallelism keeps whole; give --tp 2 or more")
        if workload.batch % self.micro_batches:
            raise TformerError(f"--batch {workload.batch} is not divisible by --micro-batches {self.micro_batches}; "
                               "each micro-batch must have the same number of sequences")
        if self.micro_batches > 1 and self.pp == 1:
            raise TformerError("--micro-batches splits a batch for a pipeline; give --pp 2 or more")
        if not workload.training and self.zero:
            raise TformerError(f"ZeRO shards training state; {workload.phase} holds only weights, so drop --zero "
                               "(--tp and --pp split the weights for inference)")


def layer_count(config) -> int:
    if config.arch == "clip":  # the vision tower's layers run first, then the text tower's
        return config.vision_n_layers + config.n_layers
    return config.n_layers + (config.n_decoder_layers or config.n_layers if config.traits.seq2seq else 0)


__all__ = ["MAX_DEVICES", "ZERO_ALIASES", "Layout", "layer_count", "parse_zero"]
