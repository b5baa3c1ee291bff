"""The unembedding and cross-entropy in one pass over chunks of rows (`train.fused_ce`).

The plain path builds the (N, V) logits, their fp32 copy, softmax and gradient: at GPT-2-small
(N = 16 x 1024 tokens, V = 50,304 padded) about 3.3 GB for each fp32 one. Here each chunk of
rows gets its logits, its loss, and at once its gradients w.r.t. h and W (the softmax minus the
one-hot is the logits' gradient, so nothing needs the logits again); the chunk's logits are then
dropped. Peak extra memory is O(chunk x V); what backward keeps is d(loss)/dh (N x d) and
d(loss)/dW (V x d), scaled there by the incoming gradient. The same idea as Liger-Kernel's
FusedLinearCrossEntropy and mgmalek/efficient_cross_entropy, in plain PyTorch ops (dynamo traces
them; no custom kernels).

Numerics follow Transformer.forward's plain path: the matmuls in the compute dtype (bf16 under
autocast), logits, log-sum-exp and softmax in fp32, the loss the mean over rows. Soft-capping
(Gemma 2: c * tanh(z / c)) and the z-loss (PaLM: weight * mean(logsumexp^2)) are optional.
"""

from __future__ import annotations

from typing import Optional

import torch


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype F.linear would compute in here: the autocast dtype inside autocast."""
    dev = t.device.type
    if torch.is_autocast_enabled(dev) and t.is_floating_point():
        return torch.get_autocast_dtype(dev)
    return t.dtype


def _chunk(x, y, wc, n: int, z_loss: float, softcap: Optional[float], dh, dw):
    """One chunk of rows: returns (sum of cross-entropies, sum of logsumexp^2) and writes the
    chunk's d(loss)/dh into dh (C, d) and adds its d(loss)/dW to dw (V, d), where given. Its own
    function so that the chunk's (C, V) buffers are freed before the next chunk allocates them."""
    logits = (x @ wc.t()).float()  # (C, V)
    if softcap is not None:
        t = torch.tanh(logits.div_(softcap))  # (C, V), kept for the gradient
        logits.copy_(t).mul_(softcap)
    target = logits.gather(1, y[:, None]).squeeze(1)  # (C,)
    # log-sum-exp by hand, so that exp(logits - max) overwrites the logits and becomes the
    # softmax: one (C, V) fp32 buffer (torch.logsumexp would allocate a second)
    m = logits.amax(dim=-1)  # (C,)
    e = logits.sub_(m[:, None]).exp_()  # (C, V)
    sum_e = e.sum(dim=-1)  # (C,)
    lse = m + sum_e.log()  # (C,)
    sums = (lse - target).sum(), (lse.pow(2).sum() if z_loss > 0 else None)
    if dh is None and dw is None:
        return sums
    # d(loss)/d(capped logits) = (softmax * (1 + 2 z_loss lse) - onehot) / n, in place
    scale = (1.0 + 2.0 * z_loss * lse) / n if z_loss > 0 else torch.full_like(lse, 1.0 / n)
    g = e.mul_((scale / sum_e)[:, None])  # (C, V)
    g.scatter_add_(1, y[:, None], torch.full_like(lse, -1.0 / n)[:, None])
    if softcap is not None:
        g.mul_(t.mul_(t).neg_().add_(1.0))  # d(c tanh(z / c))/dz = 1 - tanh^2
    g = g.to(wc.dtype)
    if dh is not None:
        dh.copy_(g @ wc)  # (C, d)
    if dw is not None:
        if g.dtype == dw.dtype:
            dw.addmm_(g.t(), x)  # (V, d)
        else:  # bf16 products, accumulated in fp32 over the chunks
            dw += (g.t() @ x).float()
    return sums


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, targets, chunk: int, z_loss: float, softcap: Optional[float],
                dtype: torch.dtype, grad_h: bool, grad_w: bool):
        N = h.shape[0]
        hc, wc = h.to(dtype), w.to(dtype)  # (N, d), (V, d): no copies outside autocast
        dh = torch.empty_like(h) if grad_h else None  # (N, d)
        dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if grad_w else None  # (V, d)
        lm_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        z_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        for s in range(0, N, chunk):
            ce, zz = _chunk(hc[s:s + chunk], targets[s:s + chunk], wc, N, z_loss, softcap,
                            None if dh is None else dh[s:s + chunk], dw)
            lm_sum = lm_sum + ce
            if zz is not None:
                z_sum = z_sum + zz
        lm = lm_sum / N
        total = lm + z_loss * z_sum / N if z_loss > 0 else lm.clone()
        ctx.save_for_backward(dh, None if dw is None else dw.to(w.dtype))
        ctx.mark_non_differentiable(lm)
        return total, lm

    @staticmethod
    def backward(ctx, d_total, d_lm):
        dh, dw = ctx.saved_tensors
        dh = None if dh is None else dh * d_total.to(dh.dtype)
        dw = None if dw is None else dw * d_total.to(dw.dtype)
        return dh, dw, None, None, None, None, None, None, None


def linear_cross_entropy(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, chunk: int = 1024,
                         z_loss: float = 0.0, softcap: Optional[float] = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(total, lm_loss) of logits = softcap(h @ w.T) against targets, never building all of them.

    h: (N, d) hidden states, w: (V, d) unembedding, targets: (N,) token ids; chunk: rows of h per
    step. total = mean cross-entropy + z_loss * mean(logsumexp^2), differentiable w.r.t. h and w;
    lm_loss, the cross-entropy alone, is a reported number (no gradient)."""
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of rows, got {chunk}")
    grad = torch.is_grad_enabled()
    return _LinearCrossEntropy.apply(h, w, targets, int(chunk), float(z_loss), softcap, compute_dtype(h),
                                     grad and h.requires_grad, grad and w.requires_grad)
