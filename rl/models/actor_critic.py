"""The default policy: an actor-critic that adapts to the observation and action spaces.

Each observation entry ``[T, N, *shape]`` is encoded by its kind (images: a CNN; other ``Box``
and ``MultiBinary``: flattened; ``Discrete``/``MultiDiscrete``: one-hot per component); the
encodings are concatenated and go through a shared trunk MLP, an optional GRU or LSTM (reset
where ``episode_starts`` is set), then separate actor and critic heads. ``forward`` returns
the features auxiliary losses read in ``extras``: ``visual`` (the image encoders' outputs,
with images), ``embedding`` (after the trunk) and ``belief`` (the heads' input).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Protocol, cast, runtime_checkable

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from rl.models.distributions import ActionHead
from rl.models.encoders import ACTIVATIONS, ImageEncoder, init_layer, mlp, recurrent_core
from rl.models.gru import gru_sequence
from rl.models.lstm import lstm_sequence
from rl.models.policy import (
    EPISODE_STARTS,
    OBS,
    STATE,
    PolicyBase,
    PolicyOutput,
    empty_state,
    write_step,
)
from rl.models.value_norm import ValueNorm
from rl.utils.config import Check

RNNS = ("gru", "lstm")


class ActorCritic(PolicyBase):
    """Actor-critic over a flat dict observation space and any supported action space.

    Parts of one's own (``encoders``, ``core``, ``policy_head``, ``value_head``) are callables
    (in the config a ``_partial_`` ``_target_``) returning an ``nn.Module`` with an integer
    ``out_size``, its output's feature size.

    Args:
        observation_space: A flat ``gymnasium.spaces.Dict`` (filled in by the engine).
        action_space: ``Discrete``, 1-D ``Box`` or ``MultiDiscrete`` (filled in by the engine).
        cnn_channels: Output channels of the conv layers for image entries (3-D ``Box``,
            ``H x W x C``); ``[]`` flattens images instead.
        cnn_kernels: Kernel size of each conv layer (None: 3, or 1 for images under 3x3).
        cnn_strides: Stride of each conv layer (None: 1).
        image_encoding: For uint8 images: ``onehot`` per channel value (categorical grids such
            as minigrid's: channel ``c`` takes the values ``0..high[c]`` of the space),
            ``embed`` (a learned table over all 256 byte values per channel) or ``scale`` to
            ``[0, 1]`` (pixels).
        embed_dim: Embedding size per image channel value (``embed`` only).
        trunk_layers: Hidden sizes of the shared MLP after the encoders.
        rnn: ``gru`` or ``lstm`` for a recurrent policy, ``null`` for a memoryless one.
        head_layers: Hidden sizes of the (separate) actor and critic MLP heads.
        log_std_init: Initial log standard deviation of a Gaussian policy (``Box`` actions).
        ignore_keys: Observation entries the policy does not see (still recorded with the
            rollout, for losses that read them, e.g. depth).
        critic_keys: Observation entries only the critic sees, through a network of its own
            (``critic_layers`` on their flattened concatenation): a centralised critic that
            reads a multi-agent task's global ``state`` (MAPPO) while the actor sees only the
            agent's own entries. Empty: actor and critic share the features.
        critic_layers: Hidden sizes of that critic network.
        value_norm: The critic learns values in normalised units (:mod:`rl.models.value_norm`);
            its values are returned in the reward's units all the same.
        value_norm_beta: Decay of the normalisation's moving averages, once a rollout.
        encoders: Encoders of your own by observation entry (``{"image": MyCNN}``), built from
            the entry's ``space``, mapping its ``[B, ...]`` values as the task gives them (a
            uint8 image stays uint8) to ``[B, out_size]``.
        core: A recurrent core of your own in place of ``rnn``'s (which must then be null),
            built from ``input_size`` (the trunk's output); see :class:`Core`.
        policy_head: The policy's network of your own in place of ``head_layers``' MLP, built
            from ``input_size`` (the core's output, or the trunk's), mapping
            ``[B, input_size]`` to ``[B, out_size]``; the action head follows it.
        value_head: The critic's network of your own, likewise (``input_size``: the policy's
            input, or the ``critic_keys`` entries' flattened size); one linear layer to the
            value follows it.
    """

    def __init__(
        self,
        *,
        observation_space: gym.spaces.Dict,
        action_space: gym.Space,
        cnn_channels: Sequence[int] = (32, 64),
        cnn_kernels: Sequence[int] | None = None,
        cnn_strides: Sequence[int] | None = None,
        image_encoding: Annotated[str, Check(choices=("onehot", "embed", "scale"))] = "embed",
        embed_dim: Annotated[int, Check(ge=1)] = 8,
        trunk_layers: Sequence[int] = (128,),
        rnn: Annotated[str | None, Check(choices=RNNS)] = "gru",
        rnn_hidden_size: Annotated[int, Check(ge=1)] = 128,
        rnn_layers: Annotated[int, Check(ge=1)] = 1,
        head_layers: Sequence[int] = (),
        activation: Annotated[str, Check(choices=tuple(ACTIVATIONS))] = "relu",
        log_std_init: float = 0.0,
        ignore_keys: Sequence[str] = (),
        critic_keys: Sequence[str] = (),
        critic_layers: Sequence[int] = (64, 64),
        value_norm: bool = False,
        value_norm_beta: Annotated[float, Check(gt=0)] = 0.99999,
        encoders: Mapping[str, Any] | None = None,
        core: Any = None,
        policy_head: Any = None,
        value_head: Any = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"model.activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}"
            )
        if rnn not in (None, *RNNS):
            raise ValueError(f"model.rnn must be one of gru, lstm or null, got {rnn!r}")
        unknown = sorted(set(ignore_keys) - set(observation_space.spaces))
        if unknown:
            raise ValueError(
                f"model.ignore_keys: {unknown} are not observation entries of the task "
                f"({sorted(observation_space.spaces)})"
            )
        self.critic_keys = self._check_critic_keys(observation_space, critic_keys)
        hidden = {*ignore_keys, *self.critic_keys}
        self.keys = sorted(k for k in observation_space.spaces if k not in hidden)
        if not self.keys:
            raise ValueError(
                "model.ignore_keys / critic_keys: the actor must see at least one entry"
            )
        own = dict(encoders or {})
        unknown = sorted(set(own) - set(self.keys))
        if unknown:
            raise ValueError(
                f"model.encoders: {unknown} are not observation entries the actor sees "
                f"({self.keys})"
            )
        image_encoder = functools.partial(
            ImageEncoder,
            channels=cnn_channels,
            kernels=cnn_kernels,
            strides=cnn_strides,
            image_encoding=image_encoding,
            embed_dim=embed_dim,
            activation=activation,
        )
        feat = self._build_encoders(
            observation_space, own, image_encoder if cnn_channels else None
        )
        self.trunk, feat = mlp(feat, trunk_layers, activation)
        self.rnn_kind = rnn
        self.rnn: nn.Module | None = recurrent_core(rnn, feat, rnn_hidden_size, rnn_layers)
        self._state_shape = (rnn_layers, rnn_hidden_size)
        if core is not None:
            if rnn is not None:
                raise ValueError(
                    f"model.core replaces the built-in recurrent core: set model.rnn=null (it is "
                    f"{rnn!r})"
                )
            self.rnn, feat = _own_part(core, "model.core", "a core", input_size=feat)
            self.rnn_kind = "own"
            if not callable(getattr(self.rnn, "initial_state", None)):
                raise TypeError(
                    f"model.core: {type(self.rnn).__name__} needs initial_state(num_envs, "
                    "device) returning its state"
                )
        elif self.rnn is not None:
            feat = rnn_hidden_size
        self.actor: nn.Module
        self.critic: nn.Module
        if policy_head is None:
            self.actor, a_feat = mlp(feat, head_layers, activation)
        else:
            self.actor, a_feat = _own_part(
                policy_head, "model.policy_head", "a head", input_size=feat
            )
        critic_in = feat
        if self.critic_keys:  # a centralised critic: its own network on its own entries
            critic_in = sum(
                int(math.prod(cast(gym.spaces.Box, observation_space[k]).shape))
                for k in self.critic_keys  # Box entries (_check_critic_keys)
            )
        if value_head is not None:
            self.critic, c_feat = _own_part(
                value_head, "model.value_head", "a head", input_size=critic_in
            )
        else:
            layers = critic_layers if self.critic_keys else head_layers
            self.critic, c_feat = mlp(critic_in, layers, activation)
        self.actor_out = ActionHead(action_space, a_feat, log_std_init)
        self.critic_out = init_layer(nn.Linear(c_feat, 1), gain=1.0)
        self.value_norm = ValueNorm(value_norm_beta) if value_norm else None

    def value_norms(
        self, obs: Mapping[str, torch.Tensor]
    ) -> list[tuple[ValueNorm, torch.Tensor | None]]:
        """The value normalisation's statistics (every row's), or none."""
        return [] if self.value_norm is None else [(self.value_norm, None)]

    @staticmethod
    def _check_critic_keys(space: gym.spaces.Dict, keys: Sequence[str]) -> list[str]:
        for key in keys:
            if key not in space.spaces:
                raise ValueError(
                    f"model.critic_keys: {key!r} is not an observation entry of the task "
                    f"({sorted(space.spaces)})"
                )
            entry = space[key]
            if not isinstance(entry, gym.spaces.Box) or len(entry.shape) > 2:
                raise ValueError(
                    f"model.critic_keys: {key!r} is {space[key]}; a centralised critic reads "
                    "vector (Box) entries"
                )
        return sorted(keys)

    def _critic_input(self, obs: Mapping[str, torch.Tensor], lead: int) -> torch.Tensor:
        """The centralised critic's entries, flattened and concatenated: ``[lead, F]``."""
        parts = [obs[k].reshape(lead, -1).float() for k in self.critic_keys]
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def _values(self, x: torch.Tensor, obs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The critic's values ``[lead, 1]`` from the heads' input ``x`` (or its own entries)."""
        if self.critic_keys:
            x = self._critic_input(obs, x.shape[0])
        values = self.critic_out(self.critic(x))
        if self.value_norm is not None:  # learnt in normalised units
            values = self.value_norm.denormalize(values)
        return values

    def _build_encoders(
        self,
        observation_space: gym.spaces.Dict,
        own: Mapping[str, Any],
        image_encoder: Callable[..., ImageEncoder] | None,
    ) -> int:
        """One encoder (or encoding) per observation entry of :attr:`keys`; their feature size.

        ``image_encoder``: None flattens images.
        """
        self.encoders = nn.ModuleDict()
        self._kinds: dict[str, str] = {}
        self._onehot_n: dict[str, int] = {}
        feat = 0
        for key in self.keys:
            space = observation_space[key]
            is_image = isinstance(space, gym.spaces.Box) and len(space.shape) == 3
            if key in own:
                encoder, size = _own_part(
                    own[key], f"model.encoders.{key}", "an encoder", space=space
                )
                self.encoders[key] = encoder
                self._kinds[key] = "image" if is_image else "encoded"
                feat += size
            elif is_image and image_encoder is not None:
                enc = image_encoder(space)
                self.encoders[key] = enc
                self._kinds[key] = "image"
                feat += enc.out_size
            elif isinstance(space, gym.spaces.Box | gym.spaces.MultiBinary):
                self._kinds[key] = "flat"
                feat += int(math.prod(space.shape))
            elif isinstance(space, gym.spaces.Discrete):
                self._kinds[key] = "onehot"
                self._onehot_n[key] = int(space.n)
                feat += int(space.n)
            elif isinstance(space, gym.spaces.MultiDiscrete):
                nvec = np.asarray(space.nvec).ravel()
                self._kinds[key] = "multi_onehot"
                self._onehot_n[key] = int(nvec.sum())
                self.register_buffer(
                    f"_offsets_{self.keys.index(key)}",
                    torch.tensor(np.cumsum([0, *nvec[:-1]]), dtype=torch.long),
                    persistent=False,
                )
                feat += int(nvec.sum())
            else:
                raise ValueError(f"observation entry {key!r}: unsupported space {space}")
        return feat

    def initial_state(self, num_envs: int, device: torch.device | str) -> TensorDict:
        """Zeros: ``{"h"}`` (GRU) or ``{"h", "c"}`` (LSTM), ``[N, L, H]`` each; empty without."""
        if self.rnn is None:
            return empty_state(num_envs, device)
        if self.rnn_kind == "own":
            return cast(Core, self.rnn).initial_state(num_envs, device)
        shape = (num_envs, *self._state_shape)
        names = ("h",) if self.rnn_kind == "gru" else ("h", "c")
        return TensorDict(
            {k: torch.zeros(shape, device=device) for k in names},
            batch_size=[num_envs],
            device=torch.device(device),
        )

    def _encode(
        self, obs: Mapping[str, torch.Tensor], lead: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The concatenated encodings ``[lead, F]`` and the image encoders' part (None: none)."""
        parts, visual = [], []
        for key in self.keys:
            x = obs[key]
            x = x.reshape(lead, *x.shape[2:])
            kind = self._kinds[key]
            if kind == "image":
                parts.append(self.encoders[key](x))
                visual.append(parts[-1])
            elif kind == "encoded":
                parts.append(self.encoders[key](x))
            elif kind == "flat":
                parts.append(x.reshape(lead, -1).float())
            elif kind == "onehot":
                parts.append(
                    nn.functional.one_hot(x.long().reshape(lead), self._onehot_n[key]).float()
                )
            else:
                offsets = getattr(self, f"_offsets_{self.keys.index(key)}")
                index = x.long().reshape(lead, -1) + offsets
                onehot = torch.zeros(lead, self._onehot_n[key], device=x.device)
                parts.append(onehot.scatter_(-1, index, 1.0))
        encoded = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        if not visual:
            return encoded, None
        return encoded, torch.cat(visual, dim=-1) if len(visual) > 1 else visual[0]

    def _run_rnn(
        self, x: torch.Tensor, episode_starts: torch.Tensor, state: TensorDict
    ) -> tuple[torch.Tensor, TensorDict]:
        """The recurrent layers over ``x [T, N, F]``, resetting states at episode starts.

        A GRU step (collection) is one ``nn.GRU`` call, a sequence (the update) goes through
        :func:`~rl.models.gru.gru_sequence`: both reproduce step-by-step collection to float32
        rounding.
        """
        assert self.rnn is not None
        if self.rnn_kind == "own":
            return cast(Core, self.rnn)(x, episode_starts, state)
        h = state["h"].transpose(0, 1)  # [L, N, H]
        if self.rnn_kind == "lstm":
            c = state["c"].transpose(0, 1)
            out, (h, c) = lstm_sequence(cast(nn.LSTM, self.rnn), x, episode_starts, h, c)
            after = {"h": h.transpose(0, 1), "c": c.transpose(0, 1)}
        else:
            if x.shape[0] == 1:
                keep = (~episode_starts[0]).to(x.dtype).view(1, -1, 1)
                out, h = self.rnn(x, h.contiguous() * keep)
            else:
                out, h = gru_sequence(cast(nn.GRU, self.rnn), x, episode_starts, h.contiguous())
            after = {"h": h.transpose(0, 1)}
        return out, TensorDict(after, batch_size=state.batch_size, device=state.device)

    def forward(
        self,
        obs: Mapping[str, torch.Tensor],
        episode_starts: torch.Tensor,
        state: TensorDict,
    ) -> tuple[PolicyOutput, TensorDict]:
        """Evaluate the policy and value over a time-major batch.

        Args:
            obs: Observation entries ``[T, N, *shape]``.
            episode_starts: ``[T, N]`` bool; the recurrent state is zeroed before such steps.
            state: Recurrent state before ``obs[0]`` (batch ``[N]``).

        Returns:
            ``(PolicyOutput(dist over [T, N], values [T, N]), state after the last step)``.
        """
        t_len, n = episode_starts.shape
        x, state, features = self._features(obs, episode_starts, state)
        dist = self.actor_out(self.actor(x).view(t_len, n, -1))
        values = self._values(x, obs).view(t_len, n)
        extras = {k: v.view(t_len, n, -1) for k, v in features.items()}
        norm = None if self.value_norm is None else self.value_norm.stats()
        return PolicyOutput(dist=dist, values=values, extras=extras, value_norm=norm), state

    def _features(
        self,
        obs: Mapping[str, torch.Tensor],
        episode_starts: torch.Tensor,
        state: TensorDict,
    ) -> tuple[torch.Tensor, TensorDict, dict[str, torch.Tensor]]:
        """The heads' input ``[T * N, F]``, the state after, and the features ``[T * N, ...]``."""
        t_len, n = episode_starts.shape
        x, visual = self._encode(obs, t_len * n)
        if len(self.trunk):  # (an empty trunk costs a module call)
            x = self.trunk(x)
        features = {"embedding": x} if visual is None else {"visual": visual, "embedding": x}
        if self.rnn is not None:
            out, state = self._run_rnn(x.view(t_len, n, -1), episode_starts, state)
            x = out.reshape(t_len * n, -1)
        features["belief"] = x
        return x, state, features

    @torch.no_grad()
    def act(
        self,
        step: TensorDict,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> TensorDict:
        """One step of ``N`` environments into ``step`` (the heads run on ``[N, F]`` directly)."""
        obs = {k: v.unsqueeze(0) for k, v in step.get(OBS).items()}
        x, state, _ = self._features(obs, step.get(EPISODE_STARTS).unsqueeze(0), step.get(STATE))
        dist = self.actor_out(self.actor(x))
        return write_step(step, dist, self._values(x, obs)[:, 0], state, deterministic, generator)


@runtime_checkable
class Core(Protocol):
    """A recurrent core of one's own (``model.core``): what :class:`ActorCritic` calls on it.

    It resets its state where ``episode_starts`` is set.
    """

    out_size: int

    def initial_state(self, num_envs: int, device: torch.device | str) -> TensorDict:
        """The state before any step, a ``TensorDict`` of batch ``[num_envs]``."""
        ...

    def __call__(
        self, x: torch.Tensor, episode_starts: torch.Tensor, state: TensorDict
    ) -> tuple[torch.Tensor, TensorDict]:
        """``x [T, N, F]`` from ``state``: ``(out [T, N, out_size], state after)``."""
        ...


def _own_part(build: Any, where: str, what: str, **inputs: Any) -> tuple[nn.Module, int]:
    """A part of one's own (``where``: its config key) built from ``inputs``, checked; its size."""
    if not callable(build):
        raise ValueError(
            f"{where}: expected a callable that builds {what} (a _partial_ _target_), got "
            f"{type(build).__name__}"
        )
    try:
        part = build(**inputs)
    except TypeError as err:  # (its signature: the part is built from these inputs)
        given = ", ".join(f"{k}=..." for k in inputs)
        raise TypeError(f"{where}: building {what} from ({given}) failed: {err}") from err
    name = type(part).__name__
    if not isinstance(part, nn.Module):
        raise TypeError(f"{where} built a {name}, not a torch.nn.Module")
    size = getattr(part, "out_size", None)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise TypeError(
            f"{where}: {name} needs an integer out_size >= 1 (its output size), has {size!r}"
        )
    return part, size
