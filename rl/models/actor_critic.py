"""Actor-critic networks that adapt to the observation space, with optional GRU memory.

Observations always arrive as a dict of time-major tensors ``[T, N, *shape]`` (samplers wrap a
non-dict space as ``{"obs": ...}``). Each entry is encoded by its kind:

* image (3-D ``Box``, ``H x W x C``): a small CNN; ``uint8`` images are one-hot encoded per
  channel value (``image_encoding="onehot"``, for categorical grids such as minigrid's: channel
  ``c`` takes the values ``0..high[c]`` of the space, so the vocabulary is small), embedded per
  channel value (``"embed"``: a learned table over all 256 byte values) or scaled to ``[0, 1]``
  (``"scale"``, right for pixels); with ``cnn_channels=[]`` the image is flattened instead;
* vector (1-D ``Box``): used as is;
* ``Discrete``: one-hot.

The encodings are concatenated, passed through a shared trunk MLP, optionally a GRU (the
hidden state is reset where ``episode_starts`` is set), then separate actor and critic heads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rl.models import distributions as D
from rl.models.gru import gru_sequence


@dataclasses.dataclass
class ActorCriticOutput:
    """Model outputs over a time-major batch.

    Attributes:
        logits: ``[T, N, A]`` unnormalised action log-probabilities.
        values: ``[T, N]`` state-value estimates.
    """

    logits: torch.Tensor
    values: torch.Tensor


def _init(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    if isinstance(layer, (nn.Linear, nn.Conv2d)):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}


def _mlp(in_size: int, layers: Sequence[int], activation: str) -> tuple[nn.Module, int]:
    modules: list[nn.Module] = []
    for size in layers:
        modules += [_init(nn.Linear(in_size, size)), _ACTIVATIONS[activation]()]
        in_size = size
    return nn.Sequential(*modules), in_size


class _ImageEncoder(nn.Module):
    def __init__(
        self,
        space: gym.spaces.Box,
        channels: Sequence[int],
        kernels: Sequence[int] | None,
        strides: Sequence[int] | None,
        image_encoding: str,
        embed_dim: int,
        activation: str,
    ) -> None:
        super().__init__()
        h, w, c = space.shape
        self.embed: nn.Embedding | None = None
        self.onehot_size = 0
        self.scale = 1.0
        if image_encoding == "onehot":
            # ALGO: one-hot of each channel's value, concatenated: as expressive as an
            # embedding followed by the first conv, with no embedding gradient to scatter and
            # no input gradient for the first conv (the update's costliest parts otherwise).
            if space.dtype != "uint8":
                raise ValueError("image_encoding='onehot' needs a uint8 image space")
            sizes = [int(np.asarray(space.high)[..., i].max()) + 1 for i in range(c)]
            if sum(sizes) > 64:
                raise ValueError(
                    f"image_encoding='onehot': the image space's high values give {sum(sizes)} "
                    "one-hot channels; declare each channel's real maximum in the space's high "
                    "(e.g. 10, 5, 2 for minigrid's object, colour, state) or use 'embed'"
                )
            self.register_buffer(
                "onehot_offsets", torch.tensor(np.cumsum([0, *sizes[:-1]])), persistent=False
            )
            self.onehot_size = in_ch = sum(sizes)
        elif image_encoding == "embed":
            if space.dtype != "uint8":
                raise ValueError("image_encoding='embed' needs a uint8 image space")
            self.embed = nn.Embedding(256 * c, embed_dim)
            self.register_buffer("offsets", torch.arange(c) * 256, persistent=False)
            in_ch = c * embed_dim
        elif image_encoding == "scale":
            self.scale = 1.0 / 255.0 if space.dtype == "uint8" else 1.0
            in_ch = c
        else:
            raise ValueError(
                f"image_encoding must be 'onehot', 'embed' or 'scale', got {image_encoding!r}"
            )
        kernels = (
            list(kernels) if kernels is not None else [3 if min(h, w) >= 3 else 1] * len(channels)
        )
        strides = list(strides) if strides is not None else [1] * len(channels)
        if len(kernels) != len(channels) or len(strides) != len(channels):
            raise ValueError(
                f"cnn_kernels ({len(kernels)}) and cnn_strides ({len(strides)}) need one value "
                f"per cnn_channels entry ({len(channels)})"
            )
        convs: list[nn.Module] = []
        for out_ch, k, stride in zip(channels, kernels, strides, strict=True):
            if min(h, w) < k:
                raise ValueError(
                    f"image {space.shape}: a {k}x{k} conv does not fit the {h}x{w} feature map "
                    "left by the layers before it; use smaller cnn_kernels or cnn_strides"
                )
            convs += [_init(nn.Conv2d(in_ch, out_ch, k, stride)), _ACTIVATIONS[activation]()]
            in_ch, h, w = out_ch, (h - k) // stride + 1, (w - k) // stride + 1
        self.convs = nn.Sequential(*convs)
        self.out_size = in_ch * h * w

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, H, W, C] -> [B, F]
        if self.onehot_size:
            index = x.long() + self.onehot_offsets  # [B, H, W, C]
            onehot = torch.zeros(*x.shape[:3], self.onehot_size, device=x.device)
            x = onehot.scatter_(-1, index, 1.0).permute(0, 3, 1, 2)
        elif self.embed is not None:
            e = self.embed(x.long() + self.offsets)  # [B, H, W, C, E]
            x = e.flatten(-2).permute(0, 3, 1, 2)
        else:
            x = x.float().permute(0, 3, 1, 2) * self.scale
        return self.convs(x).flatten(1)


class ActorCritic(nn.Module):
    """Actor-critic over a dict observation space and a discrete action space.

    Args:
        observation_space: A ``gymnasium.spaces.Dict`` (filled in by the engine).
        action_space: A ``gymnasium.spaces.Discrete`` (filled in by the engine).
        cnn_channels: Output channels of the conv layers for image entries; ``[]`` flattens
            images instead.
        cnn_kernels: Kernel size of each conv layer (None: 3, or 1 for images under 3x3).
        cnn_strides: Stride of each conv layer (None: 1).
        image_encoding: ``onehot`` or ``embed`` (categorical uint8 grids), ``scale`` (pixels).
        embed_dim: Embedding size per image channel value (``embed`` only).
        trunk_layers: Hidden sizes of the shared MLP after the encoders.
        rnn: ``gru`` for a recurrent policy, ``null`` for a memoryless one.
        rnn_hidden_size: GRU state size.
        rnn_layers: GRU layers.
        head_layers: Hidden sizes of the (separate) actor and critic MLP heads.
        activation: ``relu``, ``tanh`` or ``elu``.
    """

    def __init__(
        self,
        *,
        observation_space: gym.spaces.Dict,
        action_space: gym.spaces.Discrete,
        cnn_channels: Sequence[int] = (32, 64),
        cnn_kernels: Sequence[int] | None = None,
        cnn_strides: Sequence[int] | None = None,
        image_encoding: str = "embed",
        embed_dim: int = 8,
        trunk_layers: Sequence[int] = (128,),
        rnn: str | None = "gru",
        rnn_hidden_size: int = 128,
        rnn_layers: int = 1,
        head_layers: Sequence[int] = (),
        activation: str = "relu",
    ) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"ActorCritic needs a Discrete action space, got {action_space}")
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        self.keys = sorted(observation_space.spaces)
        self.encoders = nn.ModuleDict()
        self._kinds: dict[str, str] = {}
        feat = 0
        for key in self.keys:
            space = observation_space[key]
            if isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and cnn_channels:
                enc = _ImageEncoder(
                    space,
                    cnn_channels,
                    cnn_kernels,
                    cnn_strides,
                    image_encoding,
                    embed_dim,
                    activation,
                )
                self.encoders[key] = enc
                self._kinds[key] = "image"
                feat += enc.out_size
            elif isinstance(space, gym.spaces.Box):
                self._kinds[key] = "flat"
                feat += int(math.prod(space.shape))
            elif isinstance(space, gym.spaces.Discrete):
                self._kinds[key] = "onehot"
                feat += int(space.n)
            else:
                raise ValueError(f"observation entry {key!r}: unsupported space {space}")
        self._onehot_n = {
            k: int(observation_space[k].n) for k, kind in self._kinds.items() if kind == "onehot"
        }
        self.trunk, feat = _mlp(feat, trunk_layers, activation)
        if rnn not in (None, "gru"):
            raise ValueError(f"rnn must be 'gru' or null, got {rnn!r}")
        self.rnn = nn.GRU(feat, rnn_hidden_size, rnn_layers) if rnn == "gru" else None
        if self.rnn is not None:
            for name, p in self.rnn.named_parameters():
                if "weight" in name:
                    nn.init.orthogonal_(p)
                else:
                    nn.init.zeros_(p)
            feat = rnn_hidden_size
        self._hidden_shape = (rnn_layers, rnn_hidden_size) if self.rnn is not None else (1, 1)
        self.actor, a_feat = _mlp(feat, head_layers, activation)
        self.critic, c_feat = _mlp(feat, head_layers, activation)
        self.actor_out = _init(nn.Linear(a_feat, int(action_space.n)), gain=0.01)
        self.critic_out = _init(nn.Linear(c_feat, 1), gain=1.0)

    # ------------------------------------------------------------------ state
    @property
    def is_recurrent(self) -> bool:
        """True for a GRU policy."""
        return self.rnn is not None

    @property
    def hidden_shape(self) -> tuple[int, int]:
        """``(L, H)`` of the recurrent state (a dummy ``(1, 1)`` for memoryless models)."""
        return self._hidden_shape

    def initial_hidden(self, num_envs: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Zero recurrent state ``[L, N, H]``."""
        return torch.zeros(self._hidden_shape[0], num_envs, self._hidden_shape[1], device=device)

    # ---------------------------------------------------------------- forward
    def _encode(self, obs: Mapping[str, torch.Tensor], lead: int) -> torch.Tensor:
        parts = []
        for key in self.keys:
            x = obs[key]
            x = x.reshape(lead, *x.shape[2:])
            kind = self._kinds[key]
            if kind == "image":
                parts.append(self.encoders[key](x))
            elif kind == "flat":
                parts.append(x.reshape(lead, -1).float())
            else:
                parts.append(
                    nn.functional.one_hot(x.long().reshape(lead), self._onehot_n[key]).float()
                )
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def _run_rnn(
        self, x: torch.Tensor, episode_starts: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GRU over ``x [T, N, F]``, zeroing each env's state before its episode starts.

        One step (collection) is one ``nn.GRU`` call; sequences (the update) go through
        :func:`~rl.models.gru.gru_sequence`, which resets states mid-sequence and has a
        hand-written BPTT. Both reproduce step-by-step collection to float32 rounding.
        """
        assert self.rnn is not None
        if x.shape[0] == 1:
            keep = (~episode_starts[0]).to(x.dtype).view(1, -1, 1)
            return self.rnn(x, hidden * keep)  # type: ignore[no-any-return]
        return gru_sequence(self.rnn, x, episode_starts, hidden)

    def forward(
        self,
        obs: Mapping[str, torch.Tensor],
        episode_starts: torch.Tensor,
        hidden: torch.Tensor,
    ) -> tuple[ActorCriticOutput, torch.Tensor]:
        """Evaluate the policy and value over a time-major batch.

        Args:
            obs: Observation entries ``[T, N, *shape]``.
            episode_starts: ``[T, N]`` bool; the recurrent state is zeroed before such steps.
            hidden: ``[L, N, H]`` recurrent state before ``obs[0]``.

        Returns:
            ``(ActorCriticOutput(logits [T, N, A], values [T, N]), hidden [L, N, H])``.
        """
        t_len, n = episode_starts.shape
        x = self.trunk(self._encode(obs, t_len * n))
        if self.rnn is not None:
            out, hidden = self._run_rnn(x.view(t_len, n, -1), episode_starts, hidden)
            x = out.reshape(t_len * n, -1)
        logits = self.actor_out(self.actor(x)).view(t_len, n, -1)
        values = self.critic_out(self.critic(x)).view(t_len, n)
        return ActorCriticOutput(logits=logits, values=values), hidden

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, torch.Tensor],
        episode_starts: torch.Tensor,
        hidden: torch.Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step for a batch of environments (``[N, ...]`` inputs, no time dimension).

        Returns:
            ``(actions [N], logprobs [N], values [N], logits [N, A], hidden [L, N, H])``.
        """
        out, hidden = self(
            {k: v.unsqueeze(0) for k, v in obs.items()}, episode_starts.unsqueeze(0), hidden
        )
        logits = out.logits[0]
        actions = D.sample(logits, deterministic, generator)
        return actions, D.log_prob(logits, actions), out.values[0], logits, hidden
