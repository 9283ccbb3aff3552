"""What each attention kind is, without torch: the facts the config validates against, the ledger
costs by and the CLI prints. The model's registry (tformer.model.attention.registry) and the
ledger's (tformer.cost.attention) hold one entry per name here; a test keeps the three name sets equal.

Kinds fall in three families (the textbook's chapters 16 and 19):
  exact        softmax(Q K^T / sqrt(d) + bias) V over every allowed pair, computed differently
  sparse       the same formula over a fixed subset of pairs (a window, strides, global tokens, blocks)
  approximate  a different formula that approximates full softmax attention (low rank, kernels, hashing)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttnKind:
    family: str  # exact | sparse | approximate
    causal: bool  # can run in a causal (decoder) stack
    computed: str  # how, in one phrase: "with a mask", "with gathered blocks", ...
    options: tuple[str, ...] = ()  # the ModelConfig.attn_* fields it reads
    position_bias: bool = False  # accepts an additive score bias (ALiBi, T5's relative buckets)
    summary: str = ""


ATTN_KINDS: dict[str, AttnKind] = {
    "sdpa": AttnKind("exact", True, "PyTorch's fused kernels (flash / memory-efficient / math)", position_bias=True,
                     summary="the fast path: torch.nn.functional.scaled_dot_product_attention"),
    "reference": AttnKind("exact", True, "step by step, the n x n scores written out", position_bias=True,
                          summary="the paper's formula step by step; the only kind that returns the weights"),
    "tiled": AttnKind("exact", True, "blocks of queries and keys with a running max and sum (online softmax)",
                      ("attn_block",), position_bias=True,
                      summary="FlashAttention's algorithm in PyTorch: the n x n matrix is never materialised"),
    "chunked": AttnKind("exact", True, "queries in chunks, each against every key", ("attn_block",), position_bias=True,
                        summary="exact attention one chunk of queries at a time (peak memory chunk x n)"),
    "sliding": AttnKind("sparse", True, "with gathered blocks (each query block against one span of w + block keys)",
                        ("attn_window", "attn_dilation"),
                        summary="each token sees the w most recent (causal, Mistral's window) or w on each side"),
    "strided": AttnKind("sparse", True, "with gathered blocks of w (own and previous block) plus strided columns",
                        ("attn_window",),
                        summary="Sparse Transformer (Child et al. 2019): a local window plus a strided summary"),
    "longformer": AttnKind("sparse", True, "with gathered blocks (window) plus dense rows and columns (global)",
                           ("attn_window", "attn_dilation", "attn_global", "attn_block"),
                           summary="sliding window (dilated per layer) plus global tokens that see and are seen by all"),
    "bigbird": AttnKind("sparse", True, "with gathered blocks (window, random and global blocks)",
                        ("attn_block", "attn_random", "attn_global", "attn_seed"),
                        summary="block window + random blocks fixed at init + global blocks"),
    "linformer": AttnKind("approximate", False, "keys and values projected along the sequence to k rows",
                          ("attn_proj",),
                          summary="low rank: learned E, F (k x n) shrink n keys to k (bidirectional only)"),
    "linear": AttnKind("approximate", True, "phi(Q) (phi(K)^T V) with phi = elu + 1; causal: prefix sums in chunks",
                       ("attn_block",),
                       summary="kernelised attention, O(n); the causal form decodes with an O(1) state"),
    "performer": AttnKind("approximate", True, "positive orthogonal random features (FAVOR+); causal: prefix sums "
                          "in chunks", ("attn_features", "attn_block", "attn_seed"),
                          summary="random features approximate the softmax kernel, O(n · features); O(1) decode state"),
    "lsh": AttnKind("approximate", True, "hash, sort, attend within a sorted chunk and the one before it",
                    ("attn_block", "attn_hashes", "attn_seed"),
                    summary="Reformer: angular LSH buckets, attention inside sorted chunks, rounds combined"),
}
ATTN_IMPLS = tuple(ATTN_KINDS)
EXACT_KINDS = tuple(name for name, kind in ATTN_KINDS.items() if kind.family == "exact")


@dataclass(frozen=True)
class AttnOptions:
    """One layer's attention settings, read off the config (ModelConfig.attention_options(layer)).

    window: keys each query sees (sliding, strided, longformer, bigbird: in tokens); None = no window
    dilation: gap between the window's keys in this layer (1 = contiguous)
    global_tokens: leading positions that attend to every key and every query attends to
    block: tile / chunk / block / bucket size in tokens
    random: BigBird's random key blocks per query block
    features: Performer's random features
    proj: Linformer's projected length k
    hashes: LSH hash rounds
    seed: fixes random patterns and features at init (with the layer index)
    """

    kind: str
    layer: int
    window: int | None
    dilation: int
    global_tokens: int
    block: int
    random: int
    features: int
    proj: int
    hashes: int
    seed: int
    max_positions: int
