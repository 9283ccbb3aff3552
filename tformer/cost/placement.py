"""Where each parameter tensor sits when a model is spread over devices: its shape on one
tensor-parallel rank, the pipeline stage that holds it, and what rank 0 of a ZeRO/FSDP shard group
keeps of it. Plain arithmetic over the architecture description; no torch.

Parameters per device:
- tensor parallelism (Megatron-LM, Shoeybi et al. 2019): q, k, v, up and gate split their outputs
  by T (column-parallel, bias split too), o and down their inputs (row-parallel, bias kept whole),
  the token table and an untied output head their vocabulary rows (vocabulary-parallel, padded to
  ceil(V / T) rows); norms, position and segment tables, the pooler and BERT's head transform are
  kept whole on every rank;
- pipeline parallelism: the layers in run order cut into P contiguous stages (the first
  L mod P stages take one more); a stack's tables sit with its first layer, its final norm with its
  last, the heads on the last stage, which keeps its own copy of a tied token table when P > 1;
- ZeRO (Rajbhandari et al. 2020) over the D replicas: stage 1 shards the optimizer state (fp32
  master and moments), 2 the gradients too, 3 the weights too. Each tensor is cut along its first
  dimension into D pieces of ceil(rows / D) rows (FSDP2's per-parameter sharding; rank 0 holds a
  full piece), so a device holds sum(ceil(rows / D) x rest) elements of each sharded state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tformer.cost.architecture import Architecture, Bridge, Linear, Recurrent, RecurrentAttention, describe
from tformer.cost.layout import layer_count

# How tensor parallelism cuts a Linear's tensors: (weight, bias) -> "rows" (dim 0), "cols" (dim 1), "whole".
_LINEAR_SPLITS = {"column": ("rows", "rows"), "row": ("cols", "whole"), "vocab": ("rows", "rows"),
                  "whole": ("whole", "whole")}


@dataclass(frozen=True)
class PlacedTensor:
    name: str
    shape: tuple[int, ...]
    split: str  # "rows", "cols" or "whole" (see _LINEAR_SPLITS)
    anchor: int | None  # the layer (in run order) it sits with; None: the heads, on the last stage
    in_layer: bool = False  # a layer's own tensor (ZeRO-3 gathers these one layer at a time)

    def tp_shape(self, tp: int) -> tuple[int, ...]:
        if self.split == "rows":
            return (math.ceil(self.shape[0] / tp),) + self.shape[1:]
        if self.split == "cols":
            return (self.shape[0], math.ceil(self.shape[1] / tp)) + self.shape[2:]
        return self.shape


def layer_spans(arch: Architecture) -> dict[str, range]:
    """Each stack's layers as indices in run order (encoder layers, then decoder layers)."""
    spans, start = {}, 0
    for st in arch.stacks:
        depth = max((layer.index for layer in st.layers), default=-1) + 1  # rnn-seq2seq's bridge and attention
        spans[st.name] = range(start, start + depth)  # blocks sit at their stack's last layer
        start += depth
    return spans


def placed_tensors(arch: Architecture) -> list[PlacedTensor]:
    """Every parameter tensor with how tensor parallelism splits it and the layer it sits with: a
    stack's tables and embedding norm with its first layer, its final norm with its last."""
    spans = layer_spans(arch)
    out: list[PlacedTensor] = []

    def linear(spec: Linear | None, parallel: str, anchor: int | None, in_layer: bool = False) -> None:
        if spec is not None:
            weight_split, bias_split = _LINEAR_SPLITS[parallel]
            out.extend(PlacedTensor(n, s, bias_split if n.endswith(".bias") else weight_split, anchor, in_layer)
                       for n, s in spec.parameters().items())

    def whole(part, anchor: int | None, in_layer: bool = False) -> None:
        if part is not None:
            out.extend(PlacedTensor(n, s, "whole", anchor, in_layer) for n, s in part.parameters().items())

    first = spans[arch.stacks[0].name].start
    if arch.tok_embed is not None:  # a ViT reads pixels, not tokens
        out.append(PlacedTensor(arch.tok_embed.path + ".weight", arch.tok_embed.shape, "rows", first))
    whole(arch.type_embed, first)
    for st in arch.stacks:
        span = spans[st.name]
        whole(st.patches, span.start)  # an image's patch projection and [CLS], with the stack's first layer
        whole(st.positions.table, span.start)
        whole(st.embed_norm, span.start)
        for layer in st.layers:
            i = span[layer.index]
            if isinstance(layer, (Recurrent, Bridge, RecurrentAttention)):  # recurrent blocks stay whole on every rank
                whole(layer, i, True)
                continue
            for att in layer.attention:
                whole(att.norm, i, True)
                for lin in (att.q, att.k, att.v):
                    linear(lin, "column", i, True)
                linear(att.o, "row", i, True)
            whole(layer.mlp.norm, i, True)
            linear(layer.mlp.up, "column", i, True)
            linear(layer.mlp.gate, "column", i, True)
            linear(layer.mlp.down, "row", i, True)
        whole(st.final_norm, span[-1])
        whole(st.pool_norm, span[-1])
    linear(arch.pooler, "whole", None)
    linear(arch.classifier, "whole", None)
    whole(arch.contrastive, None)
    if arch.mlm_head is not None:
        linear(arch.mlm_head.dense, "whole", None)
        whole(arch.mlm_head.norm, None)
        linear(arch.mlm_head.decoder, "vocab", None)
    if arch.lm_head is not None:
        linear(arch.lm_head.linear, "vocab", None)
    return out


def stage_layers(n_layers: int, pp: int) -> list[range]:
    """Contiguous layer ranges per stage; the first n mod P stages take one more layer."""
    base, extra = divmod(n_layers, pp)
    ranges, start = [], 0
    for s in range(pp):
        size = base + (1 if s < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def stage_finder(ranges: list[range]):
    """anchor -> the stage holding layer ``anchor`` (None: the heads, on the last stage)."""
    owner = [s for s, r in enumerate(ranges) for _ in r]
    last = len(ranges) - 1
    return lambda anchor: last if anchor is None else owner[anchor]


def stage_tensors(config, tp: int, pp: int, arch: Architecture | None = None,
                   tensors: list[PlacedTensor] | None = None) -> list[list[tuple[PlacedTensor, tuple[int, ...]]]]:
    """Per pipeline stage, each tensor one tensor-parallel rank holds and its shape there (``arch`` and
    ``tensors``: describe(config) and placed_tensors of it, when the caller has them already)."""
    arch = arch or describe(config)
    stage_of = stage_finder(stage_layers(layer_count(config), pp))
    stages: list[list[tuple[PlacedTensor, tuple[int, ...]]]] = [[] for _ in range(pp)]
    tensors = tensors or placed_tensors(arch)
    for t in tensors:
        stages[stage_of(t.anchor)].append((t, t.tp_shape(tp)))
    head = arch.lm_head.linear if arch.lm_head is not None else (arch.mlm_head.decoder if arch.mlm_head else None)
    table = tensors[0]  # the token table
    if head is not None and head.tied and stage_of(table.anchor) != pp - 1:
        # The last stage computes the logits with its own copy of the tied table (Megatron-LM's way;
        # the two copies' gradients are summed between the first and last stage).
        copy = replace(table, name=table.name + " (tied copy)", anchor=None)
        stages[-1].append((copy, copy.tp_shape(tp)))
    return stages


def stage_parameters(config, tp: int = 1, pp: int = 1) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Per pipeline stage, the (name, shape) of every parameter tensor one tensor-parallel rank holds."""
    return [[(t.name, shape) for t, shape in st] for st in stage_tensors(config, tp, pp)]


def sharded_elements(shapes, shards: int) -> int:
    """Elements rank 0 holds when each tensor is cut along dim 0 into ``shards`` pieces of
    ceil(rows / shards) rows (FSDP2's per-parameter sharding)."""
    if shards == 1:
        return sum(math.prod(s) for s in shapes)
    return sum(math.ceil((s[0] if s else 1) / shards) * math.prod(s[1:]) for s in shapes)  # s = (): a scalar
