"""Export a trained policy for use without the framework: ONNX or a ``torch.export`` program.

The exported function is the policy's deterministic step with the run's frozen observation
normalisation and a ``Box``'s action bounds folded in: raw observations in, the environment's
actions out. Inputs: the flat observation entries ``[N, ...]``, ``episode_start`` ``[N]`` bool,
then ``state.<name>``; outputs: ``action`` ``[N, ...]``, then ``next_state.<name>`` to feed back
(``N`` dynamic). docs/concepts/evaluation.md describes the files.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey
from torch import nn

from rl.checkpoints.files import checked_file_path, checkpoint_file
from rl.evaluation.inference import InferenceAgent
from rl.models.policy import Policy, first_step
from rl.utils.config import ConfigError
from rl.utils.files import write_atomic, write_atomic_by_name

__all__ = [
    "EXPORT_FORMATS",
    "ExportError",
    "ExportedPolicy",
    "export_checkpoint",
    "export_policy",
]

ExportFormat = Literal["onnx", "pt2"]
EXPORT_FORMATS: tuple[str, ...] = ("onnx", "pt2")
_SUFFIX = {"onnx": ".onnx", "pt2": ".pt2"}
_EXAMPLE_BATCH = 2  # (torch.export specialises sizes 0 and 1: the example batch is 2)
_CHECK_OBSERVATIONS = 32


class ExportError(RuntimeError):
    """The policy could not be exported, or the export does not act as the policy does."""


class ExportedPolicy(nn.Module):
    """A policy's deterministic step as a function of tensors alone (what is exported).

    The normalizer's statistics and a ``Box`` action space's bounds are buffers.
    """

    def __init__(
        self,
        model: Policy,
        observation_space: gym.spaces.Dict,
        action_space: gym.Space,
        normalizer: Any | None,
        state_keys: Sequence[NestedKey],
    ) -> None:
        super().__init__()
        self.model = model
        self.obs_keys = list(observation_space.spaces)
        self.state_keys = list(state_keys)
        transform = {} if normalizer is None else normalizer.observation_transform()
        self.normalized = [k for k in self.obs_keys if k in transform]
        self.clip = 0.0 if normalizer is None else float(normalizer.settings.clip)
        for i, k in enumerate(self.normalized):
            mean, inv_std = transform[k]
            self.register_buffer(f"obs_mean_{i}", mean.float())
            self.register_buffer(f"obs_inv_std_{i}", inv_std.float())
        self.box = isinstance(action_space, gym.spaces.Box)
        if isinstance(action_space, gym.spaces.Box):
            self.register_buffer("action_low", torch.as_tensor(action_space.low).float())
            self.register_buffer("action_high", torch.as_tensor(action_space.high).float())
            self.action_dtype = torch.from_numpy(np.zeros(0, action_space.dtype)).dtype

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(*observation entries, episode_start, *state)`` -> ``(action, *next state)``."""
        n = len(self.obs_keys)
        obs = dict(zip(self.obs_keys, inputs[:n], strict=True))
        starts = inputs[n]
        for i, k in enumerate(self.normalized):
            mean, inv_std = self.get_buffer(f"obs_mean_{i}"), self.get_buffer(f"obs_inv_std_{i}")
            obs[k] = ((obs[k] - mean) * inv_std).clamp(-self.clip, self.clip)
        state = _state_of(self.state_keys, inputs[n + 1 :], starts.shape[0])
        output, after = self.model(
            {k: v.unsqueeze(0) for k, v in obs.items()}, starts.unsqueeze(0), state
        )
        action = first_step(output.dist).mode()
        if self.box:
            high, low = self.get_buffer("action_high"), self.get_buffer("action_low")
            action = torch.maximum(torch.minimum(action, high), low)
            action = action.to(self.action_dtype)
        return (action, *(after[k] for k in self.state_keys))


@dataclasses.dataclass(frozen=True)
class ExportInfo:
    """What was written: the file, its ``<file>.json`` description and how it was checked."""

    path: Path
    description: Path
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    checked_observations: int


def _state_keys(state: TensorDict) -> list[NestedKey]:
    """The state's leaves, nested ones as key tuples (named ``a.b`` in the exported file)."""
    return list(state.keys(include_nested=True, leaves_only=True))


def _key_name(key: NestedKey) -> str:
    return key if isinstance(key, str) else ".".join(map(str, key))


def _state_of(keys: Sequence[NestedKey], values: Sequence[torch.Tensor], batch: Any) -> TensorDict:
    """The policy's state from its leaves (nested entries rebuilt)."""
    state = TensorDict({}, batch_size=[batch])
    for key, value in zip(keys, values, strict=True):
        state.set(key, value)
    return state


def _example_inputs(
    agent: InferenceAgent, batch: int, generator: np.random.Generator
) -> tuple[torch.Tensor, ...]:
    """``batch`` sampled observations, episode starts and states (the exported inputs)."""
    space = agent.observation_space
    space.seed(int(generator.integers(2**31)))
    samples = [space.sample() for _ in range(batch)]
    obs = [
        torch.from_numpy(np.stack([np.asarray(s[k], dtype=space[k].dtype) for s in samples]))
        for k in space.spaces
    ]
    starts = torch.from_numpy(generator.random(batch) < 0.5)
    state = agent.model.initial_state(batch, "cpu")
    states = (torch.randn_like(state[k].float()).to(state[k].dtype) for k in _state_keys(state))
    return (*obs, starts, *states)


def _describe(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> list[dict[str, Any]]:
    """The exported inputs' or outputs' names, dtypes and shapes (batch ``N``)."""
    return [
        {"name": n, "dtype": str(x.dtype).removeprefix("torch."), "shape": ["N", *x.shape[1:]]}
        for n, x in zip(names, tensors, strict=True)
    ]


def export_policy(
    agent: InferenceAgent,
    path: str | Path,
    fmt: ExportFormat = "onnx",
    *,
    check_observations: int = _CHECK_OBSERVATIONS,
    seed: int = 0,
) -> ExportInfo:
    """Write ``agent``'s deterministic policy to ``path`` and check it acts as the agent does.

    A CPU copy of the agent's model is exported; ``<path>.json`` describes the file.

    Args:
        agent: The policy, its spaces and its normalisation.
        path: The file to write (``.onnx`` or ``.pt2``), atomically.
        fmt: ``onnx`` or ``pt2`` (``torch.export``).
        check_observations: Sampled observations on which the written file must give the
            agent's own deterministic actions (0: no check).
        seed: Seed of the sampled observations.

    Raises:
        ExportError: The policy could not be exported, or the file acts otherwise.
        UnsafePathError: The folder written into is a link (or a run's linked ``checkpoints``).
    """
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"export: expected one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    path = checked_file_path(path)
    if agent.action_space is None:
        raise ExportError("export needs the environment's action space (the agent has none)")
    # A copy: the agent keeps its model where it runs (the check below acts with it).
    model = copy.deepcopy(agent.model).to("cpu").eval()
    state_keys = _state_keys(model.initial_state(1, "cpu"))
    wrapper = ExportedPolicy(
        model, agent.observation_space, agent.action_space, agent.normalizer, state_keys
    ).eval()
    rng = np.random.default_rng(seed)
    example = _example_inputs(agent, _EXAMPLE_BATCH, rng)
    states = [f"state.{_key_name(k)}" for k in state_keys]
    names = [*agent.observation_space.spaces, "episode_start", *states]
    batch = torch.export.Dim("batch", min=1, max=2**20)
    dynamic = tuple({0: batch} for _ in example)
    try:
        with torch.no_grad(), _quiet_exporter():
            program = torch.export.export(
                wrapper, example, dynamic_shapes=(dynamic,), strict=False
            )
            outputs_example = wrapper(*example)
    except Exception as e:  # what torch.export cannot trace in the policy: torch's message
        raise ExportError(f"{type(model).__name__} could not be exported: {e}") from e
    output_names = ["action", *(f"next_state.{_key_name(k)}" for k in state_keys)]
    inputs, outputs = _describe(names, example), _describe(output_names, outputs_example)
    if fmt == "onnx":
        _write_onnx(program, path, names, output_names)
    else:
        archive = io.BytesIO()
        torch.export.save(program, archive)
        write_atomic(path, archive.getvalue(), what="export")
    description = path.with_name(path.name + ".json")
    write_atomic(
        description,
        json.dumps(
            {
                "format": fmt,
                "inputs": inputs,
                "outputs": outputs,
                "action_space": str(agent.action_space),
                "observation_normalization": bool(wrapper.normalized),
                "deterministic": True,
            },
            indent=1,
        ),
        what="export description",
    )
    checked = 0
    if check_observations:
        checked = _check(agent, path, fmt, check_observations, rng)
    return ExportInfo(path, description, inputs, outputs, checked)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The ONNX exporter's progress lines and INFO logs kept off the console (warnings stay)."""
    loggers = [logging.getLogger(n) for n in ("onnxscript", "onnx_ir", "torch.onnx")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            # torch's own pytree deprecation, raised inside torch.export for TensorDicts
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            # nn.GRU/LSTM re-assign their flat weights when traced: harmless (checked below)
            warnings.filterwarnings("ignore", message=".*assigned during export.*")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _write_onnx(program: Any, path: Path, names: list[str], output_names: list[str]) -> None:
    try:
        with _quiet_exporter():
            onnx_program = torch.onnx.export(
                program, input_names=names, output_names=output_names, dynamo=True, verbose=False
            )
    except ImportError as e:  # onnxscript, onnx: installed with the project
        raise ExportError(f"export=onnx needs the onnx and onnxscript packages: {e}") from e
    assert onnx_program is not None
    # (by name, to a fresh temporary file with a random name: never through a link)
    write_atomic_by_name(
        path, lambda tmp: onnx_program.save(str(tmp), external_data=False), what="export"
    )


def load_exported(path: str | Path, fmt: ExportFormat) -> Any:
    """A callable ``f(*numpy inputs) -> list of numpy outputs`` running an exported file."""
    if fmt == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run_onnx(*arrays: np.ndarray) -> list[np.ndarray]:
            return list(session.run(None, dict(zip(names, arrays, strict=True))))

        return run_onnx
    module = torch.export.load(str(path)).module()

    def run_torch(*arrays: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            return [t.numpy() for t in module(*(torch.from_numpy(a) for a in arrays))]

    return run_torch


def _check(
    agent: InferenceAgent, path: Path, fmt: ExportFormat, count: int, rng: np.random.Generator
) -> int:
    """Run the written file on ``count`` sampled observations: the agent's actions, or raise."""
    example = _example_inputs(agent, count, rng)
    n_obs = len(agent.observation_space.spaces)
    state_keys = _state_keys(agent.model.initial_state(1, "cpu"))  # (its keys only)
    exported = load_exported(path, fmt)(*(x.numpy() for x in example))[0]
    expected = []
    for i in range(count):
        obs = {k: example[j][i].numpy() for j, k in enumerate(agent.observation_space.spaces)}
        rows = [x[i : i + 1] for x in example[n_obs + 1 :]]
        state = _state_of(state_keys, rows, 1).to(agent.device)
        action, _ = agent.predict_flat(obs, state, bool(example[n_obs][i]))
        expected.append(np.asarray(action))
    ok = np.allclose(exported, np.stack(expected), rtol=1e-4, atol=1e-5)
    if not ok or exported.shape != np.stack(expected).shape:
        raise ExportError(
            f"{path}: the exported policy's actions differ from the framework's on sampled "
            "observations (an operation the exporter translated otherwise)"
        )
    return count


def export_checkpoint(
    checkpoint: str | Path,
    fmt: ExportFormat = "onnx",
    path: str | Path | None = None,
    *,
    trusted_targets: Sequence[str] = (),
    config_dir: str | Path | None = None,
    searchpath: Sequence[str] | None = None,
) -> ExportInfo:
    """Export a checkpoint's policy (a file, a run's ``latest`` or a run folder: its newest).

    ``path`` defaults to ``<checkpoint>.onnx`` / ``.pt2``; the other keywords are
    :meth:`InferenceAgent.from_checkpoint`'s.
    """
    file = checkpoint_file(checkpoint)
    agent = InferenceAgent.from_checkpoint(
        file,
        deterministic=True,
        trusted_targets=trusted_targets,
        config_dir=config_dir,
        searchpath=searchpath,
    )
    target = Path(path) if path else file.with_suffix(_SUFFIX[fmt])
    return export_policy(agent, target, fmt)


def describe(info: ExportInfo) -> str:
    """Lines for the console: the file, its inputs and outputs."""
    fmt = lambda io: ", ".join(f"{d['name']} {d['dtype']}{d['shape']}" for d in io)  # noqa: E731
    return (
        f"wrote {info.path} (checked on {info.checked_observations} sampled observations) and "
        f"{info.description}\n  inputs: {fmt(info.inputs)}\n  outputs: {fmt(info.outputs)}"
    )
