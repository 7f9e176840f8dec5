"""Building blocks of :class:`~rl.models.ActorCritic`: initialisation, MLPs, CNN, RNN cores."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

__all__ = ["ACTIVATIONS", "ImageEncoder", "init_layer", "mlp", "recurrent_core"]


def init_layer(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    """``layer`` with orthogonal weights (``gain``) and zero biases (linear and conv layers)."""
    if isinstance(layer, (nn.Linear, nn.Conv2d)):
        nn.init.orthogonal_(layer.weight, gain)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
    return layer


ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}


def mlp(in_size: int, layers: Sequence[int], activation: str) -> tuple[nn.Sequential, int]:
    """Linear layers of ``layers`` sizes, each followed by ``activation``; its output size."""
    modules: list[nn.Module] = []
    for size in layers:
        modules += [init_layer(nn.Linear(in_size, size)), ACTIVATIONS[activation]()]
        in_size = size
    return nn.Sequential(*modules), in_size


class ImageEncoder(nn.Module):
    """A CNN from an image entry ``[B, H, W, C]`` to ``[B, out_size]`` features."""

    # Buffers of the encodings that use them
    onehot_offsets: torch.Tensor
    offsets: torch.Tensor

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
            convs += [init_layer(nn.Conv2d(in_ch, out_ch, k, stride)), ACTIVATIONS[activation]()]
            in_ch, h, w = out_ch, (h - k) // stride + 1, (w - k) // stride + 1
        self.convs = nn.Sequential(*convs)
        self.out_size = in_ch * h * w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, H, W, C]`` images to ``[B, out_size]`` features."""
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


def recurrent_core(
    rnn: str | None, in_size: int, hidden_size: int, layers: int
) -> nn.GRU | nn.LSTM | None:
    """The GRU or LSTM (orthogonal weights, zero biases), or None for a memoryless policy."""
    if rnn is None:
        return None
    core = (nn.GRU if rnn == "gru" else nn.LSTM)(in_size, hidden_size, layers)
    for name, p in core.named_parameters():
        if "weight" in name:
            nn.init.orthogonal_(p)
        else:
            nn.init.zeros_(p)
    return core
