"""Attention masks: which keys each query may attend to.

A mask is built once per forward pass and shared by every layer of a stack. It is kept as its
pieces: causal or not, which keys are real (padding), an optional position bias, and where the
queries and keys sit. Dense kinds (reference, sdpa) ask for ``bias``, one additive float tensor
(0 or -inf, plus any position bias) built on first use; tiled, sparse and approximate kinds read
the pieces and never build an n x n tensor.

A query that may attend to no key at all (a padding query in a left-padded causal batch, say)
would get softmax over nothing = NaN; such "dead" rows attend everywhere instead and their output
is set to zero afterwards, so no NaN ever appears, even in the backward pass.
"""

from __future__ import annotations

import torch


def causal_mask(tq: int, tk: int, device=None) -> torch.Tensor:
    """(tq, tk) bool. Queries are the last tq of tk positions: query i sits at tk - tq + i."""
    q_pos = torch.arange(tk - tq, tk, device=device)[:, None]
    k_pos = torch.arange(tk, device=device)[None, :]
    return k_pos <= q_pos


def tracing() -> bool:
    """Whether an exporter (torch.onnx.export, either kind, or torch.export) is tracing the model: a data-dependent
    Python branch would then bake the sample input's answer into the graph or fail to trace, so the mask keeps
    its padding and dead-row pieces unconditionally (the same numbers, without the eager shortcuts)."""
    return torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting() or torch.jit.is_tracing()


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 1 = real token -> each real token's index among its row's real tokens; padding gets its row's next one
    (or 0 before any real token): it is masked anyway."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, Tk) with 1 = real token, 0 = padding -> (B, 1, 1, Tk) bool."""
    return attention_mask.bool()[:, None, None, :]


class AttentionMask:
    """Which of ``tk`` keys each of ``tq`` queries may attend to.

    Query i sits at position ``q_start + i`` and key j at ``k_start + j`` (positions count tokens
    from the start of the sequence; a rolling KV cache that dropped old keys has k_start > 0).
    causal: a key after its query is hidden. keep: (B, Tk) bool, False = padding, or None.
    position_bias: (1|B, H|1, Tq, Tk) added to the scores, or None.
    prefix: (B,) long, or None: a prefix LM's causal mask, where each row's first ``prefix`` positions
    are seen by every query (bidirectional over the prefix, causal after it): allowed(i, j) iff
    j < prefix or j <= i.
    """

    def __init__(self, tq: int, tk: int, *, causal: bool, keep: torch.Tensor | None = None,
                 position_bias: torch.Tensor | None = None, q_start: int | None = None, k_start: int = 0,
                 dtype: torch.dtype = torch.float32, device=None, prefix: torch.Tensor | None = None):
        self.tq, self.tk, self.causal = tq, tk, causal
        self.prefix = prefix if causal else None  # a bidirectional mask already sees the whole prefix
        self.keep, self.position_bias = keep, position_bias
        self.k_start = k_start
        self.q_start = k_start + tk - tq if q_start is None else q_start
        self.dtype, self.device = dtype, device

    @classmethod
    def given(cls, bias: torch.Tensor) -> AttentionMask:
        """A mask that is its additive bias (N, 1|H, Tq, Tk): 0 where a query may attend, -inf elsewhere, plus any
        position bias. A preallocated cache builds it from its own tensors (causal, padding, the layer's window,
        every query's own column kept), so it is whole: the kinds read it as a position bias and add nothing.
        ``complete`` tells a windowed kind its window is already in it."""
        mask = cls(bias.shape[-2], bias.shape[-1], causal=False, position_bias=bias, dtype=bias.dtype,
                   device=bias.device)
        mask.complete = True
        mask.__dict__["_dense_cache"] = (bias, None)
        return mask

    complete = False  # see ``given``

    @classmethod
    def padding_only(cls, tq: int, keep: torch.Tensor, dtype: torch.dtype) -> AttentionMask:
        """Bidirectional over ``keep`` (B, Tk) bool, with its bias built now from tensors alone: no value is read
        back to decide anything, so a compiled graph holds it whole (every row must keep a key: a source)."""
        mask = cls(tq, keep.shape[1], causal=False, keep=keep, dtype=dtype, device=keep.device)
        zero = torch.zeros((), dtype=dtype, device=keep.device)
        mask.__dict__["_dense_cache"] = (torch.where(keep, zero, float("-inf"))[:, None, None, :], None)
        return mask

    @property
    def trivially_causal(self) -> bool:
        """Plain causal over a square block whose queries are its keys: SDPA's is_causal applies."""
        # bool(): under torch.export the lengths are symbolic and SDPA's is_causal takes only a Python bool
        return bool(self.causal and self.prefix is None and self.tq == self.tk and self.q_start == self.k_start)

    @property
    def hides_future(self) -> bool:
        """Some key sits after some query (a causal mask with work to do)."""
        return self.causal and self.k_start + self.tk - 1 > self.q_start

    @property
    def is_causal(self) -> bool:
        """No bias needed: plain causal attention (dense kinds pass is_causal to the kernel)."""
        return self.keep is None and self.position_bias is None and self.trivially_causal

    def positions(self):
        """(query positions (Tq,), key positions (Tk,)) as long tensors."""
        q = torch.arange(self.q_start, self.q_start + self.tq, device=self.device)
        k = torch.arange(self.k_start, self.k_start + self.tk, device=self.device)
        return q, k

    def allowed(self, q_pos: torch.Tensor | None = None, k_idx: torch.Tensor | None = None) -> torch.Tensor | None:
        """Bool, True = may attend, for queries at positions ``q_pos`` (any shape Q..., default all)
        against keys with indices ``k_idx`` (0..Tk-1, any shape K..., default all): shaped
        (B|1, 1, *Q..., *K...) broadcast as padding and causality need; None when all are allowed.
        Sparse kinds call it on gathered blocks, so the dense (Tq, Tk) grid is never formed."""
        q_pos = self.positions()[0] if q_pos is None else q_pos
        k_idx = torch.arange(self.tk, device=self.device) if k_idx is None else k_idx
        nq, nk = q_pos.dim(), k_idx.dim()
        out = None
        if self.hides_future:
            qp = q_pos.reshape(*q_pos.shape, *([1] * nk))
            kp = (k_idx + self.k_start).reshape(*([1] * nq), *k_idx.shape)
            out = (kp <= qp)[None, None]
            if self.prefix is not None:
                seen = self.prefix.reshape(-1, 1, *([1] * (nq + nk)))
                out = out | (kp[None, None] < seen)
        if self.keep is not None:
            pad = self.keep.bool()[:, k_idx].reshape(self.keep.shape[0], 1, *([1] * nq), *k_idx.shape)
            out = pad if out is None else out & pad
        return out

    @property
    def _dense(self):
        """(bias (B|1, H|1, Tq, Tk) or None, dead rows (B|1, 1, Tq, 1) or None), built on first use and kept.
        A plain dict entry rather than functools.cached_property, whose lock torch.compile cannot trace (it
        would break a compiled model's graph in every block)."""
        found = self.__dict__.get("_dense_cache")
        if found is None:
            found = self.__dict__["_dense_cache"] = self._build_dense()
        return found

    def _build_dense(self):
        if self.position_bias is None and self.keep is None and (not self.causal or not self.hides_future
                                                                 or self.trivially_causal):
            return None, None
        allowed = self.allowed()
        bias = torch.zeros((1, 1, self.tq, self.tk), dtype=self.dtype, device=self.device)
        if self.position_bias is not None:
            bias = bias + self.position_bias.to(self.dtype)
        dead = None
        if allowed is not None:
            bias = bias.masked_fill(~allowed, float("-inf"))
            dead = ~allowed.any(dim=-1, keepdim=True)
            if tracing() or bool(dead.any()):
                bias = bias.masked_fill(dead, 0.0)
            else:
                dead = None
        return bias, dead

    @property
    def bias(self) -> torch.Tensor | None:
        """(B|1, H|1, Tq, Tk) additive: -inf where a key is hidden, plus any position bias; None when
        nothing is hidden (or the mask is plain causal: see ``is_causal``)."""
        return self._dense[0]

    @property
    def dead_rows(self) -> torch.Tensor | None:
        """(B|1, 1, Tq, 1) True where a query may attend to no key; None when there is none."""
        # Causality alone always leaves a query its own key (or an earlier one): only padding kills a row.
        return None if self.keep is None else self._dense[1]


def build_mask(
    tq: int,
    tk: int,
    *,
    causal: bool,
    key_padding: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
    q_start: int | None = None,
    k_start: int = 0,
    dtype: torch.dtype = torch.float32,
    device=None,
    prefix: torch.Tensor | None = None,
) -> AttentionMask:
    """key_padding: (B, Tk), 1 = real token. Queries default to the last tq of the tk key positions.
    prefix: (B,) a prefix LM's bidirectional prefix per row (see AttentionMask)."""
    if key_padding is not None and key_padding.shape[-1] != tk:
        raise ValueError(f"attention mask covers {key_padding.shape[-1]} keys but there are {tk}")
    keep = None
    # nothing padded: keep the fast paths open (an exported graph keeps the mask: its inputs may be padded)
    if key_padding is not None and (tracing() or not bool(key_padding.all())):
        keep = key_padding.bool()
    return AttentionMask(tq, tk, causal=causal, keep=keep, position_bias=position_bias, q_start=q_start,
                         k_start=k_start, dtype=dtype, device=device, prefix=prefix)


def self_attention_mask(tq: int, past: int, k_start: int, keep: torch.Tensor | None, *, causal: bool,
                        score_bias=None, prefix: torch.Tensor | None = None, dtype=torch.float32,
                        device=None) -> AttentionMask:
    """The self-attention mask of ``tq`` queries after ``past`` positions over the keys held from position
    ``k_start``: keep (B, past + tq) bool, 1 = real, over every position (its columns from k_start are read);
    score_bias(q_pos, k_pos): a position bias (ALiBi, T5's buckets) or None."""
    total = past + tq
    if keep is not None and k_start:
        keep = keep[:, k_start:]
    bias = None
    if score_bias is not None:
        k_pos = torch.arange(k_start, total, device=device)
        bias = score_bias(k_pos[past - k_start:], k_pos)
    return build_mask(tq, total - k_start, causal=causal, key_padding=keep, position_bias=bias, k_start=k_start,
                      dtype=dtype, device=device, prefix=prefix)
