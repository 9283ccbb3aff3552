"""Attention: a registry of kinds (one function each, one signature) and the multi-head layer that uses one.

``ATTENTION`` maps each name ``ModelConfig.attn_impl`` accepts to its function or module class; each
lives in its own module (``tformer.model.attention.reference.reference``, ``...sdpa.sdpa``, ...).
"""

from tformer.model.attention.groups import expand_kv
from tformer.model.attention.multihead import MultiHeadAttention
from tformer.model.attention.kind import AttentionKind
from tformer.model.attention.registry import ATTENTION, AttentionFn, attention_fn, make_attention

__all__ = ["ATTENTION", "AttentionFn", "AttentionKind", "MultiHeadAttention", "attention_fn", "expand_kv",
           "make_attention"]
