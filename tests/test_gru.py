"""The sequence GRU with per-step resets and hand-written BPTT (rl.models.gru)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rl.models.gru import _GRULayer, gru_sequence


def _step_by_step(
    rnn: nn.GRU, x: torch.Tensor, starts: torch.Tensor, hidden: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: one ``nn.GRU`` call per step, the state zeroed before episode starts."""
    keep = (~starts).to(x.dtype)
    outs = []
    for t in range(x.shape[0]):
        hidden = hidden * keep[t].view(1, -1, 1)
        out, hidden = rnn(x[t : t + 1], hidden)
        outs.append(out)
    return torch.cat(outs), hidden


def _case(layers: int, dtype: torch.dtype, seed: int = 0):
    torch.manual_seed(seed)
    t_len, batch, features, size = 9, 4, 5, 6
    rnn = nn.GRU(features, size, layers).to(dtype)
    x = torch.randn(t_len, batch, features, dtype=dtype, requires_grad=True)
    hidden = torch.randn(layers, batch, size, dtype=dtype, requires_grad=True)
    starts = torch.rand(t_len, batch) < 0.25
    starts[0, 0] = starts[3, 2] = True  # a reset at the first step and one mid-sequence
    return rnn, x, starts, hidden


@pytest.mark.parametrize("layers", [1, 2])
def test_matches_step_by_step_gru_and_its_gradients(layers: int) -> None:
    rnn, x, starts, hidden = _case(layers, torch.float64)
    ref_out, ref_h = _step_by_step(rnn, x, starts, hidden)
    out, h = gru_sequence(rnn, x, starts, hidden)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(h, ref_h, atol=1e-12, rtol=0)
    weights = torch.randn_like(out)
    inputs = [x, hidden, *rnn.parameters()]
    ref_grads = torch.autograd.grad((ref_out * weights).sum() + ref_h.square().sum(), inputs)
    grads = torch.autograd.grad((out * weights).sum() + h.square().sum(), inputs)
    for ref, got in zip(ref_grads, grads, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


def test_backward_passes_gradcheck() -> None:
    torch.manual_seed(1)
    t_len, batch, size = 6, 3, 4
    gi = torch.randn(t_len, batch, 3 * size, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(batch, size, dtype=torch.float64, requires_grad=True)
    keep = (torch.rand(t_len, batch, 1) > 0.3).to(torch.float64)
    w_hh = torch.randn(3 * size, size, dtype=torch.float64, requires_grad=True)
    b_hh = torch.randn(3 * size, dtype=torch.float64, requires_grad=True)
    assert keep.eq(0).any()
    assert torch.autograd.gradcheck(_GRULayer.apply, (gi, h0, keep, w_hh, b_hh))


def test_float32_sequence_reproduces_collection_steps() -> None:
    """The update's sequence pass gives what collection's one-step calls gave (float32)."""
    rnn, x, starts, hidden = _case(1, torch.float32, seed=2)
    with torch.no_grad():
        ref_out, _ = _step_by_step(rnn, x, starts, hidden)
        out, _ = gru_sequence(rnn, x, starts, hidden)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=0)


def test_a_reset_cuts_the_gradient_to_earlier_steps() -> None:
    rnn, x, starts, hidden = _case(1, torch.float64, seed=3)
    starts[:] = False
    starts[5] = True  # every environment starts an episode at step 5
    out, _ = gru_sequence(rnn, x, starts, hidden)
    (grad_x,) = torch.autograd.grad(out[5:].sum(), [x])
    assert grad_x[:5].abs().max() == 0
    assert grad_x[5:].abs().max() > 0


def test_rejects_what_it_does_not_implement() -> None:
    x, starts, hidden = torch.zeros(2, 1, 3), torch.zeros(2, 1, dtype=torch.bool), None
    with pytest.raises(ValueError, match="unidirectional"):
        gru_sequence(nn.GRU(3, 4, bidirectional=True), x, starts, hidden)
