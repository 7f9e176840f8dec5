"""A GRU over time-major sequences with per-step state resets, and its hand-written BPTT.

``torch.nn.GRU`` cannot reset mid-sequence, and calling it once per segment (or per step)
leaves autograd to record some thirty small operations per step. :func:`gru_sequence` takes the
input projection of every step in one matrix product, runs the recurrence without recording it,
and computes the gradient in one hand-derived backward pass (nine operations per step). It
computes exactly what ``torch.nn.GRU`` computes, cell for cell, with its parameters, so
checkpoints and the collection-time ``nn.GRU`` calls are unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rl.utils.dynamo import eager_under_compile


class _GRULayer(torch.autograd.Function):
    """One GRU layer over ``[T, B]``: ``h_t = cell(gi_t, h_{t-1} * keep_t)``.

    Inputs: ``gi`` ``[T, B, 3H]`` (``x_t W_ih^T + b_ih``, gates r, z, n), ``h0`` ``[B, H]``,
    ``keep`` ``[T, B, 1]`` (0 where the state is reset before step ``t``), ``w_hh`` ``[3H, H]``,
    ``b_hh`` ``[3H]``. Output: ``[T, B, H]``, the state after every step.
    """

    @staticmethod
    def forward(
        ctx: Any,
        gi: torch.Tensor,
        h0: torch.Tensor,
        keep: torch.Tensor,
        w_hh: torch.Tensor,
        b_hh: torch.Tensor,
    ) -> torch.Tensor:
        t_len, batch, three_h = gi.shape
        hsize = three_h // 3
        resets = (keep == 0).any(dim=2).any(dim=1).tolist()
        h_prev = gi.new_empty(t_len, batch, hsize)  # state entering each step (after reset)
        rz = gi.new_empty(t_len, batch, 2 * hsize)
        n = gi.new_empty(t_len, batch, hsize)
        gh_n = gi.new_empty(t_len, batch, hsize)
        out = gi.new_empty(t_len, batch, hsize)
        w_hh_t = w_hh.t()
        h = h0
        for t in range(t_len):
            if resets[t]:
                h = h * keep[t]
            h_prev[t] = h
            gh = torch.addmm(b_hh, h, w_hh_t)
            torch.add(gi[t, :, : 2 * hsize], gh[:, : 2 * hsize], out=rz[t]).sigmoid_()
            torch.addcmul(gi[t, :, 2 * hsize :], rz[t, :, :hsize], gh[:, 2 * hsize :], out=n[t])
            n[t].tanh_()
            gh_n[t] = gh[:, 2 * hsize :]
            # h' = n + z * (h - n), as torch's GRU cell computes it
            h = torch.addcmul(n[t], rz[t, :, hsize:], h - n[t], out=out[t])
        ctx.save_for_backward(h_prev, rz, n, gh_n, keep, w_hh)
        ctx.resets = resets
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h_prev, rz, n, gh_n, keep, w_hh = ctx.saved_tensors
        t_len, batch, hsize = n.shape
        r, z = rz[..., :hsize], rz[..., hsize:]
        # Factors that do not depend on the incoming gradient, for every step at once.
        one_minus_z = 1.0 - z
        d_n_pre = one_minus_z * (1.0 - n * n)  # dh -> d(n's pre-activation)
        d_r_pre = gh_n * r * (1.0 - r)  # d(n's pre-activation) -> d(r's pre-activation)
        d_z_pre = (h_prev - n) * z * (1.0 - z)  # dh -> d(z's pre-activation)
        d_gi = grad_out.new_empty(t_len, batch, 3 * hsize)
        d_gh = grad_out.new_empty(t_len, batch, 3 * hsize)
        dh = torch.zeros_like(grad_out[0])
        for t in range(t_len - 1, -1, -1):
            dh = dh + grad_out[t]
            d_a_n = torch.mul(dh, d_n_pre[t], out=d_gi[t, :, 2 * hsize :])
            torch.mul(d_a_n, d_r_pre[t], out=d_gh[t, :, :hsize])
            torch.mul(dh, d_z_pre[t], out=d_gh[t, :, hsize : 2 * hsize])
            torch.mul(d_a_n, r[t], out=d_gh[t, :, 2 * hsize :])
            dh = torch.addmm(dh * z[t], d_gh[t], w_hh)
            if ctx.resets[t]:
                dh = dh * keep[t]
        d_gi[..., : 2 * hsize] = d_gh[..., : 2 * hsize]
        flat_d_gh = d_gh.reshape(t_len * batch, 3 * hsize)
        d_w_hh = flat_d_gh.t().mm(h_prev.reshape(t_len * batch, hsize))
        d_b_hh = flat_d_gh.sum(0)
        return d_gi, dh, None, d_w_hh, d_b_hh


# Eager under torch.compile (pipeline.compile): which steps reset is data (a list read from
# the tensor), and compiled it would be one graph per reset pattern, recompiled minibatch after
# minibatch up to dynamo's limit. The layers around it are compiled.
@eager_under_compile
def gru_sequence(
    rnn: nn.GRU, x: torch.Tensor, episode_starts: torch.Tensor, hidden: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rnn`` (unidirectional, time-major) over ``x [T, B, F]`` from ``hidden [L, B, H]``.

    Every layer's state is zeroed before the steps where ``episode_starts [T, B]``.

    Returns:
        ``(outputs [T, B, H] of the last layer, final state [L, B, H])``.
    """
    if rnn.bidirectional or rnn.batch_first or not rnn.bias:
        raise ValueError("gru_sequence supports unidirectional, time-major GRUs with biases")
    keep = (~episode_starts).to(x.dtype).unsqueeze(-1)
    t_len, batch = episode_starts.shape
    finals = []
    for layer in range(rnn.num_layers):
        w_ih = getattr(rnn, f"weight_ih_l{layer}")
        b_ih = getattr(rnn, f"bias_ih_l{layer}")
        w_hh = getattr(rnn, f"weight_hh_l{layer}")
        b_hh = getattr(rnn, f"bias_hh_l{layer}")
        gi = torch.addmm(b_ih, x.reshape(t_len * batch, -1), w_ih.t()).view(t_len, batch, -1)
        x = _GRULayer.apply(gi, hidden[layer], keep, w_hh, b_hh)
        finals.append(x[-1])
    return x, torch.stack(finals)
