"""What it costs to join an image and a text, three ways, from a vision config (arch 'vit') and a text config
(or a CLIP config's two towers). Each is a ledger op list assembled from the ledgers of models tformer already
describes, never a formula of its own:

  early  one Transformer (the text config's) over the n_image + n_text tokens: the image's patches projected
         straight to the text width (as the ViT's patch rows are), then every layer over both. Attention grows
         as (n_image + n_text)^2, the rest as n_image + n_text; scoring N images against N texts is N^2 passes.
  late   two towers, each pooled to one vector, projected and compared by a dot product (CLIP): the ViT's rows
         over n_image, the text tower's over n_text, and CLIP's head rows (projections, the N x N similarity,
         both losses). Attention grows as n_image^2 + n_text^2; N x N pairs cost N passes per tower + N^2 p.
  cross  the text stack cross-attends to the image tokens (Flamingo-like) in every k-th layer: the ViT's rows,
         a connector Linear to the text width where the widths differ (LLaVA's projector), the text tower's rows,
         and an encoder-decoder's cross-attention rows (its K and V over the n_image tokens, n_text x n_image
         scores) in layers 0, k, 2k, ... Scoring N x N pairs: the text stack runs N^2 times.

Each mode's figures are those of a training step's ledger, forward rows only: parameters, forward FLOPs (and
the attention cores' share), and memory (weights, gradients, optimizer state, the activations kept for the
backward pass). The workload's batch is N (pairs), its seq n_text.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.cost.description import Linear
from tformer.cost.ledger import Ledger, Workload, ledger
from tformer.cost.oplist import OpListBuilder
from tformer.cost.ops import Op
from tformer.cost.vision import attention_core_flops

FUSIONS = ("early", "late", "cross")
# The fields a text tower's shape is made of, carried into the configs each mode is built from.
_TOWER = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size", "max_positions", "norm",
          "norm_placement", "norm_eps", "activation", "gated_mlp", "bias", "dropout", "attention_dropout",
          "activation_dropout")
_HOW = {
    "early": "one Transformer over the n_image + n_text tokens",
    "late": "two towers, pooled vectors, a dot product (CLIP)",
    "cross": "the text stack cross-attends to the image tokens",
}
_SCALING = {
    "early": "attention ∝ (n_image + n_text)^2, the rest ∝ n_image + n_text; N x N scores: N^2 joint passes",
    "late": "attention ∝ n_image^2 + n_text^2, the rest ∝ n_image + n_text; N x N scores: N passes a tower + N^2 p",
    "cross": "self-attention ∝ n_image^2 + n_text^2, cross ∝ n_text n_image (L/k layers), K/V ∝ n_image; "
             "N x N scores: N^2 text passes",
}


@dataclass
class Fusion:
    """One mode's op list (a Ledger over the text config) and what scoring every image against every text costs."""

    mode: str
    n_image: int
    n_text: int
    ledger: Ledger
    score_all_flops: int  # forward FLOPs to score N images against N texts (N = the workload's batch)
    every: int = 1

    @property
    def how(self) -> str:
        return _HOW[self.mode] + (f" (every {self.every}th layer)" if self.mode == "cross" and self.every > 1 else "")

    @property
    def scaling(self) -> str:
        return _SCALING[self.mode]

    @property
    def attention_flops(self) -> int:
        return attention_core_flops(self.ledger)

    def to_dict(self) -> dict:
        lg = self.ledger
        return {"mode": self.mode, "how": self.how, "n_image": self.n_image, "n_text": self.n_text,
                "batch": lg.workload.batch, "params": lg.params["total"], "forward_flops": lg.flops["total"],
                "forward_matmul_flops": lg.flops["matmul"], "attention_flops": self.attention_flops,
                "attention_share": self.attention_flops / lg.flops["matmul"], "memory": lg.memory["total"],
                "activations": lg.memory["activations"], "score_all_flops": self.score_all_flops,
                "scaling": self.scaling}


# The two towers ---------------------------------------------------------------------------------------------
def text_tower(clip) -> ModelConfig:
    """CLIP's text tower as a config of its own: an encoder with no head over learned positions. (CLIP's tower
    is causal: the same matmuls, plus one element-wise FLOP a score for the mask.)"""
    if clip.arch != "clip":
        raise TformerError(f"{clip.traits.label} has no text tower; text_tower() is for arch='clip'")
    return ModelConfig(arch="encoder", lm_head=False, pooler=False, position="learned", final_norm=True,
                       tied_embeddings=False, name=f"{clip.name}/text", **{k: getattr(clip, k) for k in _TOWER})


def towers(config) -> tuple[ModelConfig, ModelConfig]:
    """(vision, text) of a CLIP config."""
    return config.vision_tower(), text_tower(config)


def clip_pair(vision, text, projection_dim: int | None = None) -> ModelConfig:
    """A CLIP config whose towers have the sizes of ``vision`` (a ViT) and ``text``."""
    _check_pair(vision, text)
    return ModelConfig(arch="clip", position="learned", image_size=vision.image_size, patch_size=vision.patch_size,
                       num_channels=vision.num_channels, vision_n_layers=vision.n_layers,
                       vision_d_model=vision.d_model, vision_n_heads=vision.n_heads, vision_d_ff=vision.d_ff,
                       projection_dim=projection_dim or text.d_model, name=f"{vision.name}+{text.name}",
                       **{k: getattr(text, k) for k in _TOWER})


def _check_pair(vision, text) -> None:
    if vision.arch != "vit":
        raise TformerError(f"the vision config must be a ViT (arch='vit'), got arch='{vision.arch}'")
    if text.traits.images or text.traits.recurrent or text.traits.seq2seq:
        raise TformerError(f"the text config must be a Transformer decoder or encoder, got arch='{text.arch}'")


# Assembling op lists ------------------------------------------------------------------------------------------
def _rows(config, w: Workload, stack: str, keep=None) -> list[Op]:
    """The forward rows of ``config``'s training-step ledger (so each keeps what its backward needs), the first
    stack's rows renamed to ``stack`` (their module path in the joined model)."""
    lg = ledger(config, w)
    first = lg.architecture.stacks[0].name
    out = []
    for op in lg.select(phase="forward"):
        if keep is None or keep(op):
            named = stack + op.name[len(first):] if op.name.startswith(first + ".") else op.name
            out.append(replace(op, name=named, stack=stack if op.stack == first else op.stack))
    return out


def _train(w: Workload, **changes) -> Workload:
    return replace(w, phase="train", **changes)


def _fit(text, tokens: int):
    """``text`` with a position table long enough for ``tokens``."""
    return text.replace(max_positions=max(text.max_positions, tokens))


def early_fusion(vision, text, workload: Workload) -> Fusion:
    _check_pair(vision, text)
    n_i, n_t, w = vision.image_tokens, workload.seq, _train(workload)
    joint = _fit(text, n_i + n_t)
    patches = vision.replace(d_model=text.d_model, n_heads=text.n_heads, d_ff=text.d_ff, n_layers=1, n_classes=0)
    image = _rows(patches, w, "image", keep=lambda op: op.name.startswith("encoder.patch_embed"))
    lookup = _rows(joint, w, "fused", keep=lambda op: op.kind == "embedding")  # the n_text tokens' lookup alone
    body = _rows(joint, replace(w, seq=n_i + n_t), "fused", keep=lambda op: op.kind != "embedding")
    lg = _assemble(text, workload, image + lookup + body)
    # Every image against every text: N^2 joint passes of one pair (FLOPs are linear in the batch).
    N = workload.batch
    single = lg if N == 1 else early_fusion(vision, text, replace(workload, batch=1)).ledger
    return Fusion("early", n_i, n_t, lg, N * N * single.flops["total"])


def late_fusion(vision, text, workload: Workload, projection_dim: int | None = None) -> Fusion:
    pair = clip_pair(vision, text, projection_dim)
    n_i, n_t, w = vision.image_tokens, workload.seq, _train(workload)
    features = vision.replace(n_classes=0)
    pool = _rows(pair, w, "vision", keep=lambda op: op.name == "vision.pool_norm" and not vision.final_norm)
    head = _rows(pair, w, "vision", keep=lambda op: op.stack == "")
    ops = _rows(features, w, "vision") + pool + _rows(text, w, "text") + head
    lg = _assemble(text, workload, ops)
    return Fusion("late", n_i, n_t, lg, lg.flops["total"])  # N x N scores are this batch's similarity


def cross_fusion(vision, text, workload: Workload, every: int = 1) -> Fusion:
    _check_pair(vision, text)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise TformerError(f"cross-attention every k-th layer needs a whole k of at least 1, got {every!r}")
    n_i, n_t, w = vision.image_tokens, workload.seq, _train(workload)
    image = _rows(vision.replace(n_classes=0), w, "vision") + _connector(vision, text, w)
    pair = ModelConfig(arch="encoder-decoder", position="learned", n_decoder_layers=text.n_layers,
                       **{k: getattr(_fit(text, max(n_i, n_t)), k) for k in _TOWER})
    crossed = _rows(pair.replace(n_layers=1), replace(w, seq=n_i, seq_decoder=n_t), "decoder",
                    keep=lambda op: ".cross_attn" in op.name and op.layer % every == 0)
    by_layer: dict[int, list[Op]] = {}
    for op in crossed:
        by_layer.setdefault(op.layer, []).append(replace(op, name="text" + op.name[len("decoder"):], stack="text"))
    text_ops = []
    for op in _rows(text, w, "text"):
        text_ops.append(op)
        if op.name.endswith(".attn.residual"):  # the cross block follows the self-attention block
            text_ops += by_layer.get(op.layer, [])
    lg = _assemble(text, workload, image + text_ops)
    # Every image against every text: the image side N times, the text stack (with its cross blocks) N^2 times.
    N = workload.batch
    text_side = sum(op.flops for op in text_ops)
    return Fusion("cross", n_i, n_t, lg, lg.flops["total"] - text_side + N * text_side, every)


def _connector(vision, text, w: Workload) -> list[Op]:
    """The image tokens brought to the text width, where the widths differ: one Linear over B n_image rows."""
    if vision.d_model == text.d_model:
        return []
    b = OpListBuilder(text, w)
    b.linear(Linear("connector", "projection", vision.d_model, text.d_model, True), None, "connector",
             w.batch * vision.image_tokens)
    return b.ops


def _assemble(text, workload: Workload, ops: list[Op]) -> Ledger:
    """The rows as one training step's Ledger over the text config (for its parameter, FLOP and memory sums)."""
    return Ledger(text, _train(workload), ops)


def fusion_costs(vision, text, workload: Workload, every: int = 1) -> list[Fusion]:
    """The three modes for one image of ``vision`` and ``workload.seq`` text tokens, at batch N."""
    return [early_fusion(vision, text, workload), late_fusion(vision, text, workload),
            cross_fusion(vision, text, workload, every)]


def fusion_scaling(vision, text, workload: Workload, every: int = 1) -> list[dict]:
    """Each mode's forward FLOPs at the given sizes, with the image side doubled (n_image about 4x) and with the
    text twice as long: the ratios show which of n_image and n_text each mode is quadratic in."""
    bigger = vision.replace(image_size=2 * vision.image_size)
    cases = {"as given": (vision, text, workload.seq), "image side x2": (bigger, text, workload.seq),
             "text x2": (vision, _fit(text, 2 * workload.seq), 2 * workload.seq)}
    flops = {case: [f.ledger.flops["total"] for f in fusion_costs(v, t, replace(workload, seq=s), every)]
             for case, (v, t, s) in cases.items()}
    return [{"mode": mode, "flops": flops["as given"][i], "n_image": vision.image_tokens,
             "n_image_x2": bigger.image_tokens,
             "image_x2_ratio": flops["image side x2"][i] / flops["as given"][i],
             "text_x2_ratio": flops["text x2"][i] / flops["as given"][i]} for i, mode in enumerate(FUSIONS)]
