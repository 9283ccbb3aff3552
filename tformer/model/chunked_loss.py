"""Cross-entropy over a large vocabulary without the whole (rows, V) logits in memory.

The plain LM loss forms logits = h @ W^T for every position at once, (B*T, V) fp32 numbers, and the backward as
many again for their gradient: at Gemma 3's V = 262,144 that is 1 GiB per 1,024 tokens, each. The loss needs far
less. Per row i it is lse_i - z_{i,y_i} (lse: the log-sum-exp of the row's logits), and the gradient of the row's
logits is softmax(z_i) - onehot(y_i), which the row can rebuild from h_i, W and lse_i alone.

So ``chunked_lm_loss`` walks the rows ``chunk`` at a time twice: in the forward it keeps only each row's lse (and
adds up the loss), in the backward it recomputes the chunk's logits, turns them in place into their gradient and
multiplies that into the gradients of h and W. At most one chunk's logits exist at any time. The price is the head's
matmul run once more (2 * rows * d * V FLOPs: the ledger's recompute row, tformer.cost.oplist).

With label smoothing eps (as F.cross_entropy): loss_i = lse_i - (1 - eps) z_{i,y_i} - eps mean_j z_ij, gradient
softmax(z_i) - (1 - eps) onehot(y_i) - eps / V. With a logit softcap c (Gemma 2), z = c tanh(z_raw / c) and the
gradient reaching z_raw is dz * (1 - tanh^2).

Memory of one chunk of n rows (what tformer.cost.memory.logits_bytes charges): its fp32 logits, worked on in place
(n * V * 4 bytes); with a 16-bit compute dtype also the 16-bit logits the matmul writes before the fp32 copy, and the
16-bit gradient the backward matmuls read (n * V * 2); with a softcap a second fp32 buffer for tanh's output in the
backward instead (n * V * 4).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tformer.core.errors import TformerError
from tformer.model.base import IGNORE_INDEX
from tformer.model.decoder import DecoderLM
from tformer.model.linear import Linear


def chunked_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                    bias: torch.Tensor | None = None, *, ignore_index: int = IGNORE_INDEX,
                    label_smoothing: float = 0.0, softcap: float | None = None,
                    compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mean cross-entropy (nats) of logits = hidden @ weight^T (+ bias) against ``labels``, over the rows whose
    label is not ``ignore_index``; equal to F.cross_entropy on the whole logits (.float()), gradients included.

    hidden (..., d); weight (V, d); bias (V,) or None; labels (...) int64, the same leading shape as hidden.
    chunk: rows of logits formed at a time. softcap: logits -> cap * tanh(logits / cap) before the softmax.
    compute_dtype: the matmuls' dtype (autocast's bf16 or fp16: what the plain path's head computes in under
    autocast); None: the hidden states' own. The softcap, the softmax, the loss and the gradient sums are fp32
    (under autocast the plain path squashes its 16-bit logits in 16 bits: the two differ by bf16's rounding there).
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise TformerError(f"the loss chunk is a number of rows, at least 1; got {chunk!r}")
    if not 0 <= label_smoothing < 1:
        raise TformerError(f"label smoothing must be in [0, 1), got {label_smoothing}")
    if softcap is not None and not softcap > 0:
        raise TformerError(f"the logit softcap must be positive, got {softcap}")
    d = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != d or labels.shape != hidden.shape[:-1]:
        raise TformerError(f"chunked_lm_loss: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)} and labels "
                           f"{tuple(labels.shape)} do not fit: want (..., d), (V, d) and (...)")
    return _ChunkedLMLoss.apply(hidden.reshape(-1, d), weight, bias, labels.reshape(-1), chunk, ignore_index,
                                float(label_smoothing), softcap, compute_dtype or hidden.dtype)


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, softcap: float | None,
                  keep_tanh: bool = False):
    """(n, d) rows -> (fp32 logits (n, V), tanh's output (n, V) if ``keep_tanh`` and a softcap, else None).
    The matmul runs in w's dtype."""
    z = F.linear(h.to(w.dtype), w, b).float()  # .float() is the tensor itself when w is fp32: no copy
    if softcap is None:
        return z, None
    t = z.div_(softcap).tanh_()  # in place: z is a fresh tensor
    if not keep_tanh:
        return t.mul_(softcap), None  # the forward needs no tanh: one buffer
    return t * softcap, t


class _ChunkedLMLoss(torch.autograd.Function):
    """hidden (N, d), weight (V, d), bias (V,) | None, labels (N,) -> the mean loss; see the module docstring."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk, ignore_index, eps, softcap, compute_dtype):
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are compute_dtype's, set by hand
            w = weight.to(compute_dtype)
            b = bias.to(compute_dtype) if bias is not None else None
            N = hidden.shape[0]
            lse = torch.empty(N, dtype=torch.float32, device=hidden.device)  # per row: log sum_j exp z_ij
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for s in range(0, N, chunk):
                z, _ = _chunk_logits(hidden[s:s + chunk], w, b, softcap)  # (n, V)
                y = labels[s:s + chunk]
                keep = y != ignore_index
                # What the loss subtracts from lse, read before z is overwritten below.
                target = z.gather(1, y.clamp(min=0).unsqueeze(1)).squeeze(1)  # (n,) z at the label
                if eps:
                    target = (1 - eps) * target + eps * z.mean(1)
                m = z.amax(1)  # (n,): subtracted first, so exp never overflows
                row_lse = z.sub_(m.unsqueeze(1)).exp_().sum(1).log_().add_(m)
                lse[s:s + chunk] = row_lse
                total += torch.where(keep, row_lse - target, 0.0).sum()
                del z  # before the next chunk's logits exist, not after: one chunk at a time
        count = (labels != ignore_index).sum()
        ctx.save_for_backward(hidden, weight, bias, labels, lse, count)
        ctx.setup = (chunk, ignore_index, eps, softcap, compute_dtype)
        return total / count  # no scored row: 0 / 0 = nan, as F.cross_entropy gives

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, labels, lse, count = ctx.saved_tensors
        chunk, ignore_index, eps, softcap, compute_dtype = ctx.setup
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        V = weight.shape[0]
        scale = grad_out.float() / count  # d(mean)/d(row loss), times what arrives from above
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute_dtype)
            b = bias.to(compute_dtype) if bias is not None else None
            grad_h = torch.empty_like(hidden) if need_h else None
            # Summed over chunks in fp32 whatever the compute dtype (the plain path sums all rows in one matmul).
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
            grad_b = torch.zeros(V, dtype=torch.float32, device=weight.device) if need_b else None
            for s in range(0, hidden.shape[0], chunk):
                h = hidden[s:s + chunk]
                z, t = _chunk_logits(h, w, b, softcap, keep_tanh=True)  # recomputed: the forward kept none of it
                y = labels[s:s + chunk]
                keep = y != ignore_index
                g = z.sub_(lse[s:s + chunk].unsqueeze(1)).exp_()  # softmax, in z's memory
                if eps:
                    g.sub_(eps / V)
                g.scatter_add_(1, y.clamp(min=0).unsqueeze(1), g.new_full((len(y), 1), -(1 - eps)))
                g.mul_(torch.where(keep, scale, 0.0).unsqueeze(1))  # unscored rows: no gradient
                if t is not None:  # back through cap * tanh(z_raw / cap): times 1 - tanh^2, in tanh's memory
                    g = t.square_().neg_().add_(1).mul_(g)
                    z = None  # frees the softmax's buffer before the 16-bit copy below
                gc = g.to(compute_dtype)  # what the plain path's head backward multiplies in, under autocast
                if need_h:
                    grad_h[s:s + chunk] = gc @ w  # (n, V) @ (V, d)
                if need_w:
                    hc = h.to(compute_dtype)
                    if gc.dtype == torch.float32:
                        # (V, n) @ (n, d) summed in place, no (V, d) temporary: addmm_ in effect, spelt with out= so
                        # that FlopCounterMode (which has no formula for the in-place op) counts it.
                        torch.addmm(grad_w, gc.t(), hc, out=grad_w)
                    else:
                        grad_w += gc.t() @ hc  # a 16-bit product, summed in fp32
                if need_b:
                    grad_b += g.sum(0)
                del z, t, g, gc  # before the next chunk's logits exist, not after: one chunk at a time
        return (grad_h, grad_w.to(weight.dtype) if need_w else None, grad_b.to(bias.dtype) if need_b else None,
                None, None, None, None, None, None)


def lm_head_parts(model) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
    """(weight (V, d), bias (V,) or None, logit softcap or None) of a decoder-only model whose logits are exactly
    F.linear(h, weight, bias), then the softcap: what chunked_lm_loss recomputes. Anything else is refused in one
    line: a quantized or LoRA head (its weight is not one tensor that takes a gradient), a class with its own
    lm_logits (chunked_lm_loss would not know what it adds), a task head."""
    if not isinstance(model, DecoderLM) or getattr(model, "lm_head", None) is None:
        raise TformerError(f"--loss-chunk needs a decoder-only model with an LM head; got {type(model).__name__}")
    head = model.lm_head
    if type(head) not in (Linear, torch.nn.Linear):
        raise TformerError(f"--loss-chunk recomputes the logits from the LM head's weight, but this head is a "
                           f"{type(head).__name__}; train with a plain (unquantized, un-adapted) head or drop --loss-chunk")
    if type(model).lm_logits is not DecoderLM.lm_logits:
        raise TformerError(f"--loss-chunk recomputes DecoderLM's logits (the head, then the softcap); "
                           f"{type(model).__name__} computes its own, so drop --loss-chunk")
    return head.weight, head.bias, getattr(model.config, "logit_softcap", None)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast computes matmuls in on ``device`` where it is on here, else None."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


__all__ = ["autocast_dtype", "chunked_lm_loss", "lm_head_parts"]
