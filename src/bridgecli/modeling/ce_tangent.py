"""Per-token cross-entropy of the LM head and its tangent, without the tangent logits in the forward.

For response rows h (final-normed hidden states), their tangents dh, the head (W, b) and targets t:
l = logsumexp(z) - z_t with z = h W^T (+ b), and dl = dh . ((p - onehot_t) W), p = softmax(z).
Subtracting the one-hot before the product keeps confident tokens (p_t near 1) accurate.

Without autograd (the ``bridge`` scorer) each chunk of rows is one forward (on a GPU in half
precision, ``ce_kernel.ce_loss_and_q`` fuses the softmax). Differentiated through (the ``atp``
scorer, which needs d(sum of dl) with respect to h and dh), each chunk is an autograd function
with its reverse pass written out: it keeps h, dh and q W ([rows, hidden]) and no [rows, vocab]
tensor; the reverse pass recomputes z and the tangent logits dz = dh W^T and forms
d dl / d z = p * (dz - p . dz) (``ce_kernel.ce_grad_logits`` on a GPU). No gradient flows to the
head's weight or bias (the scorers differentiate with respect to activations and gates only).
"""

from __future__ import annotations

import torch

from . import ce_kernel


def token_ce_with_tangent(h, dh, weight, bias, targets, chunk: int = 4096):
    """(per-token losses, their tangents along dh) of the rows of ``h``, ``chunk`` rows at a time."""
    losses, tangents = [], []
    grad = torch.is_grad_enabled() and (h.requires_grad or dh.requires_grad)
    for s in range(0, h.shape[0], chunk):
        hc, dhc, tc = h[s : s + chunk], dh[s : s + chunk], targets[s : s + chunk]
        if grad:
            loss, tangent = CEChunk.apply(hc, dhc, weight, bias, tc)
        else:
            loss, tangent, _ = _ce_chunk(hc, dhc, weight, bias, tc)
        losses.append(loss)
        tangents.append(tangent)
    if not losses:
        zero = h.new_zeros(0, dtype=torch.float32)
        return zero, zero
    return torch.cat(losses), torch.cat(tangents)


def residual_projection(h, weight, bias, targets, d, chunk: int = 4096):
    """u_j = d . (w_{y_j} - W^T p_j) for the rows of ``h`` (final-normed hidden states): the target's
    output embedding minus the expected one under the head's next-token distribution, projected on
    ``d`` ([hidden]); the same softmax pieces as the loss (on a GPU in half precision the fused
    kernel), accumulated in at least float32. No autograd."""
    out = []
    with torch.no_grad():
        for s in range(0, h.shape[0], chunk):
            _, qw = loss_and_residual(h[s : s + chunk], weight, bias, targets[s : s + chunk])
            acc = _acc(qw.dtype)
            out.append(-(qw.to(acc) @ d.to(device=qw.device, dtype=acc)))  # qw = (p - onehot) W
    return torch.cat(out) if out else h.new_zeros(0, dtype=_acc(h.dtype))


def loss_and_residual(h, weight, bias, targets) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token losses, (p - onehot) W) of the rows of ``h``: (p - onehot) W is the loss's gradient
    with respect to h, and minus the output residual w_y - W^T p. No autograd."""
    with torch.no_grad():
        return _loss_and_qw(h, weight, bias, targets)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """At least float32 (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


def _logits(hc, weight, bias):
    """z as the forward formed it: in the head's dtype, or with a bias added in at least float32."""
    z = hc @ weight.T
    return z if bias is None else z.to(_acc(z.dtype)) + bias.to(_acc(z.dtype))


def _loss_and_qw(hc, weight, bias, tc) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, (p - onehot) W) of one chunk; no autograd."""
    z = _logits(hc, weight, bias)
    if bias is None and ce_kernel.usable(z):  # GPU half precision: one fused pass
        loss, q = ce_kernel.ce_loss_and_q(z, tc)
        return loss, q @ weight
    z = z.to(_acc(z.dtype))
    lse = torch.logsumexp(z, dim=-1)
    loss = lse - z.gather(1, tc[:, None])[:, 0]
    q = z.sub_(lse[:, None]).exp_()
    q[torch.arange(len(tc), device=q.device), tc] -= 1.0
    return loss, q.to(weight.dtype) @ weight


def _ce_chunk(hc, dhc, weight, bias, tc):
    """(loss, tangent, q W) of one chunk; no autograd."""
    loss, qw = _loss_and_qw(hc, weight, bias, tc)
    acc = _acc(qw.dtype)
    return loss, (qw.to(acc) * dhc.to(acc)).sum(-1), qw


def grad_logits(z, dz, lse, tc, g_a, g_loss):
    """``ce_kernel.ce_grad_logits`` (the gradient of g_a . a + g_loss . loss with respect to z) in
    torch, in at least float32, returned in z's dtype: the path off the GPU and for float64."""
    acc = _acc(z.dtype)
    p = (z.to(acc) - lse[:, None].to(acc)).exp_()
    dzf = dz.to(acc)
    abar = (p * dzf).sum(-1, keepdim=True)
    g = dzf.sub_(abar).mul_(p).mul_(g_a[:, None].to(acc))
    if g_loss is not None:
        p[torch.arange(len(tc), device=p.device), tc] -= 1.0
        g.add_(p.mul_(g_loss[:, None].to(acc)))
    return g.to(z.dtype)


class CEChunk(torch.autograd.Function):
    """(loss, a) of one chunk of rows, differentiable with respect to h and dh (module doc)."""

    @staticmethod
    def forward(ctx, hc, dhc, weight, bias, tc):
        loss, tangent, qw = _ce_chunk(hc, dhc, weight, bias, tc)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hc, dhc, weight, bias, tc, loss, qw)
        return loss, tangent

    @staticmethod
    def backward(ctx, g_loss, g_a):
        hc, dhc, weight, bias, tc, loss, qw = ctx.saved_tensors
        grad_h = grad_dh = None
        if g_a is not None and ctx.needs_input_grad[1]:  # a = dh . (q W): along dh, g_a * q W
            grad_dh = (g_a[:, None].to(qw.dtype) * qw).to(dhc.dtype)
        if (g_a is not None or g_loss is not None) and ctx.needs_input_grad[0]:
            z = _logits(hc, weight, bias)
            lse = loss + z.gather(1, tc[:, None])[:, 0].to(loss.dtype)
            if g_a is None:  # the loss term alone: dz does not matter
                g_a, dz = torch.zeros_like(loss), torch.zeros_like(z)
            else:
                dz = dhc.to(weight.dtype) @ weight.T
            if bias is None and ce_kernel.usable(z):
                gl = g_loss.float().contiguous() if g_loss is not None else None
                gz = ce_kernel.ce_grad_logits(z, dz, lse.float(), tc, g_a.float().contiguous(), gl)
            else:
                gz = grad_logits(z, dz, lse, tc, g_a, g_loss)
            grad_h = (gz.to(weight.dtype) @ weight).to(hc.dtype)
        return grad_h, grad_dh, None, None, None
