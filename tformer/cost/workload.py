"""What the model is asked to do (phase, sizes, dtype, training recipe) and the bytes per element
the ledger charges for it."""

from __future__ import annotations

from dataclasses import dataclass

from tformer.core.errors import TformerError

WORKLOAD_PHASES = ("forward", "train", "prefill", "decode")
DTYPES = ("fp32", "fp16", "bf16", "int8")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
ATTENTION_FLOPS = ("full", "causal")

# Bytes per element. int8 is a weights-only format: activations and the KV cache stay 16-bit.
WEIGHT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
ACTIVATION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 2}
INDEX_BYTES = 8  # token ids are int64
MASK_BYTES = 1  # a dropout mask keeps one byte per element (torch.bool)
LOSS_BYTES = 4  # the model computes the loss in fp32 (lm_loss casts the logits with .float())


@dataclass(frozen=True)
class Workload:
    """What the model is asked to do.

    phase: forward | train (forward + backward + optimizer step) | prefill (forward over a
    prompt, writing the KV cache) | decode (one new token per sequence, with ``context`` tokens
    already in the cache). For an encoder-decoder, ``seq`` is the source length and
    ``seq_decoder`` the target length (default: seq); in decode, the encoder output is cached.
    """

    phase: str = "forward"
    batch: int = 1
    seq: int = 128
    context: int | None = None  # decode: tokens already cached (default seq - 1)
    seq_decoder: int | None = None
    dtype: str = "fp32"  # weights; activations too, except int8 (weights only, 16-bit activations)
    optimizer: str = "adamw"
    mixed_precision: bool = False  # 16-bit weights/activations with an fp32 master copy in the optimizer
    fp32_grads: bool = False  # mixed precision: keep gradients in fp32 (18 B/param with Adam, not 16)
    checkpointing: bool = False  # recompute each layer in the backward pass, keep only layer inputs
    attention_flops: str = "full"  # full s x s (FlopCounterMode) | causal (only unmasked query-key pairs)
    materialize_scores: bool = True  # False: a fused (flash) kernel never stores the s x s scores
    # train: an LM head's logits formed this many rows at a time, forward and backward (tformer.model.chunked_loss);
    # 0: all at once. No effect on other phases.
    loss_chunk: int = 0

    def __post_init__(self) -> None:
        def choice(name, options):
            if getattr(self, name) not in options:
                raise TformerError(f"{name}='{getattr(self, name)}' is unknown; choose one of: {', '.join(options)}")

        choice("phase", WORKLOAD_PHASES)
        choice("dtype", DTYPES)
        choice("optimizer", OPTIMIZERS)
        choice("attention_flops", ATTENTION_FLOPS)
        for name in ("batch", "seq", "seq_decoder"):
            value = getattr(self, name)
            if value is None and name == "seq_decoder":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TformerError(f"{name} must be a whole number of at least 1, got {value!r}")
        if isinstance(self.loss_chunk, bool) or not isinstance(self.loss_chunk, int) or self.loss_chunk < 0:
            raise TformerError(f"loss_chunk must be a whole number of rows, 0 or more (0: no chunking), got "
                               f"{self.loss_chunk!r}")
        if self.context is not None and (isinstance(self.context, bool) or not isinstance(self.context, int) or self.context < 0):
            raise TformerError(f"context must be a whole number of at least 0, got {self.context!r}")
        if self.dtype == "int8" and self.phase == "train":
            raise TformerError("int8 is a weights-only inference format; train in fp32, bf16 or fp16")
        if self.mixed_precision and self.dtype not in ("fp16", "bf16"):
            raise TformerError("mixed precision means 16-bit compute with fp32 master weights; use dtype fp16 or bf16")

    @property
    def training(self) -> bool:
        return self.phase == "train"

    @property
    def decode_context(self) -> int:
        return self.context if self.context is not None else self.seq - 1

    @property
    def attention_kind(self) -> str:
        """The attention kind costed (a key of tformer.cost.attention.ATTENTION_COSTS, named like the
        model's implementations): the step-by-step path stores the scores, the fused kernel does not."""
        return "reference" if self.materialize_scores else "sdpa"
