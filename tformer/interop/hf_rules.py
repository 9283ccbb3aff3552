"""The pieces of the Hugging Face weight-name tables (tformer.interop.hf, hf_encoders): a rule
pairs one checkpoint tensor with the tensor(s) of ours it fills, an alias names a tied copy."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Rule:
    """Checkpoint tensor ``hf`` fills our tensors ``ours``.

    kind: "copy"; "t" (GPT-2 Conv1D stores weights as (in, out)); "cat" / "cat_t" (one fused
    tensor holding ours side by side along its last dimension, transposed for weights); "rows" (one fused
    Linear holding ours one after another along its output rows: Phi-3's qkv_proj and gate_up_proj).
    """

    hf: str
    ours: tuple[str, ...]
    kind: str = "copy"
    optional: bool = False  # absent in the checkpoint: keep our default (BART's zero logits bias)
    lead: int = 0  # the checkpoint's tensor is ours with this many leading 1-dims (ViT's cls_token (1, 1, d))


@dataclass
class Alias:
    """A second name for a tied tensor (older files store each copy). Used only if ``main`` is absent."""

    hf: str
    main: str


def linear_rules(hf: str, ours: str, bias: bool) -> list[Rule]:
    rules = [Rule(f"{hf}.weight", (f"{ours}.weight",))]
    if bias:
        rules.append(Rule(f"{hf}.bias", (f"{ours}.bias",)))
    return rules


def norm_rules(hf: str, ours: str, config) -> list[Rule]:
    return linear_rules(hf, ours, config.norm == "layernorm")


def attention_rules(h: str, o: str, names: tuple[str, str, str, str], bias: bool) -> list[Rule]:
    rules = []
    for hf_name, x in zip(names, "qkvo"):
        rules += linear_rules(f"{h}.{hf_name}", f"{o}.{x}_proj", bias)
    return rules


def with_head(rules, c, head: str, embedding: str, ours: str = "lm_head.weight"):
    """A tied head is the embedding (stored once, as HF does); an untied one is its own tensor."""
    if c.tied_embeddings:
        return rules, [Alias(head, embedding)]
    return rules + [Rule(head, (ours,))], []
