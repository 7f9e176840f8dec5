"""An LSTM over time-major sequences with per-step state resets.

``torch.nn.LSTM`` cannot zero an environment's state mid-sequence, so the sequence is cut where
any environment starts an episode, each segment is one fused ``nn.LSTM`` call and the starting
environments' states are zeroed between segments (one call per step at worst).
"""

from __future__ import annotations

import torch
from torch import nn

from rl.utils.dynamo import eager_under_compile


@eager_under_compile  # (eager under torch.compile: see rl.models.gru.gru_sequence)
def lstm_sequence(
    lstm: nn.LSTM,
    x: torch.Tensor,
    episode_starts: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``lstm`` over ``x [T, N, F]`` from ``(h, c)`` ``[L, N, H]``, zeroed before episode starts.

    Returns:
        ``(outputs [T, N, H], (h, c) after the last step)``.
    """
    t_len = x.shape[0]
    cuts = (episode_starts[1:].any(dim=1).nonzero().flatten() + 1).tolist()
    outputs = []
    start = 0
    for end in [*cuts, t_len]:
        keep = (~episode_starts[start]).to(x.dtype).view(1, -1, 1)
        out, (h, c) = lstm(x[start:end], (h * keep, c * keep))
        outputs.append(out)
        start = end
    return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), (h, c)
