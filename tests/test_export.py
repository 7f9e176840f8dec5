"""Export of a trained policy (evaluate.py export=onnx|pt2): the file run without the framework
(onnxruntime, torch.export.load) gives the framework's deterministic actions, with the
recurrent state fed back, the observation normalisation folded in and a dynamic batch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tensordict import TensorDict

import rl
from rl.evaluation import InferenceAgent
from rl.evaluation.export import ExportError, _check, export_checkpoint, export_policy
from rl.models import ActionHead, PolicyBase, PolicyOutput
from rl.tasks import build_env
from rl.tasks.factory import dict_space
from rl.utils.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
QUIET = ("logger.sinks.console.progress_bar=false", "valid=null")


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "cartpole"
    rl.train("+experiment=ppo_cartpole", "total_env_steps=4096", "eval.num_episodes=0",
             f"output_dir={out}", *QUIET)  # fmt: skip
    return out


def _env_observations(env_id: str, count: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` observations of real episodes (random actions)."""
    env = build_env({"_target_": "rl.tasks.make_gym_env", "env_id": env_id})
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    seen = []
    while len(seen) < count:
        seen.append(np.asarray(obs))
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return seen


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_exported_actions_equal_the_frameworks_on_100_observations(
    cartpole: Path, tmp_path: Path, fmt: str
) -> None:
    info = export_checkpoint(cartpole / "checkpoints" / "latest", fmt, tmp_path / f"policy.{fmt}")  # type: ignore[arg-type]
    assert info.path.is_file() and info.checked_observations > 0
    described = json.loads(info.description.read_text())
    assert [d["name"] for d in described["inputs"]] == ["obs", "episode_start"]
    assert described["outputs"][0] == {"name": "action", "dtype": "int64", "shape": ["N"]}
    agent = InferenceAgent.from_checkpoint(cartpole, deterministic=True)
    observations = _env_observations("CartPole-v1", 100)
    expected = np.array([agent.predict(o, episode_start=True)[0] for o in observations])
    batch = np.stack(observations).astype(np.float32)
    starts = np.ones(len(batch), dtype=bool)
    if fmt == "onnx":  # onnxruntime alone: no torch, no rl
        session = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
        (actions,) = session.run(None, {"obs": batch, "episode_start": starts})
        (one,) = session.run(None, {"obs": batch[:1], "episode_start": starts[:1]})
    else:
        module = torch.export.load(str(info.path)).module()
        (actions,) = module(torch.from_numpy(batch), torch.from_numpy(starts))
        (one,) = module(torch.from_numpy(batch[:1]), torch.from_numpy(starts[:1]))
        actions, one = actions.numpy(), one.numpy()
    assert len(set(expected.tolist())) == 2  # both actions occur: the comparison means something
    np.testing.assert_array_equal(actions, expected)  # a batch of 100 ...
    assert one[0] == expected[0]  # ... and of 1: the batch is dynamic


def test_a_recurrent_policy_carries_its_state_through_the_export(tmp_path: Path) -> None:
    """nav_small's GRU policy: 3 episodes side by side, the state fed back, starts reset it."""
    run = rl.train("+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "eval.num_episodes=0",
                   f"output_dir={tmp_path / 'nav'}", *QUIET)  # fmt: skip
    info = export_checkpoint(run.run_dir, "onnx", tmp_path / "nav.onnx")
    names = [d["name"] for d in info.inputs]
    assert names == ["goal", "image", "episode_start", "state.h"]
    session = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
    agents = [InferenceAgent.from_checkpoint(run.run_dir) for _ in range(3)]
    task = {
        "_target_": "rl_envs.pointnav.PointNavEnv",
        "size": 9,
        "rooms_per_side": 2,
        "max_steps": 30,
    }
    envs = [build_env(task) for _ in range(3)]
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    state = np.zeros([3, *info.inputs[3]["shape"][1:]], dtype=np.float32)
    starts = np.ones(3, dtype=bool)
    for agent in agents:
        agent.reset()
    compared = 0
    for _ in range(40):
        feed = {
            "goal": np.stack([o["goal"] for o in obs]).astype(np.float32),
            "image": np.stack([o["image"] for o in obs]).astype(np.uint8),
            "episode_start": starts,
            "state.h": state,
        }
        actions, state = session.run(None, feed)
        expected = [agent.act(o) for agent, o in zip(agents, obs, strict=True)]
        np.testing.assert_array_equal(actions, expected)
        compared += 3
        starts = np.zeros(3, dtype=bool)
        for i, env in enumerate(envs):
            obs[i], _, terminated, truncated, _ = env.step(int(actions[i]))
            if terminated or truncated:
                obs[i], _ = env.reset()
                agents[i].reset()
                starts[i] = True
    assert compared == 120


def test_normalisation_and_action_bounds_are_folded_in(tmp_path: Path) -> None:
    """Pendulum with observation normalisation: raw observations in, clipped actions out."""
    run = rl.train("+experiment=ppo_continuous", "total_env_steps=2048", "eval.num_episodes=0",
                   "normalize.observations=true", f"output_dir={tmp_path / 'pend'}",
                   *QUIET)  # fmt: skip
    agent = InferenceAgent.from_checkpoint(run.run_dir)
    assert agent.normalizer is not None
    mean, inv_std = agent.normalizer.observation_transform()["obs"]
    assert not torch.allclose(mean, torch.zeros_like(mean))  # statistics that change the inputs
    info = export_policy(agent, tmp_path / "pendulum.onnx", "onnx")
    session = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
    observations = np.stack(_env_observations("Pendulum-v1", 100)).astype(np.float32)
    (actions,) = session.run(
        None, {"obs": observations, "episode_start": np.ones(100, dtype=bool)}
    )
    expected = np.stack([agent.predict(o, episode_start=True)[0] for o in observations])
    np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)
    assert actions.min() >= -2.0 and actions.max() <= 2.0  # Pendulum's bounds
    agent.normalizer = None  # the same policy without the statistics acts otherwise
    unnormalised = np.stack([agent.predict(o, episode_start=True)[0] for o in observations])
    assert not np.allclose(unnormalised, expected, atol=1e-3)


def test_the_export_checks_itself_against_the_policy(cartpole: Path, tmp_path: Path) -> None:
    """A file that does not act as the policy is refused (here: another policy's file)."""
    agent = InferenceAgent.from_checkpoint(cartpole)
    info = export_policy(agent, tmp_path / "a.onnx", "onnx")
    with torch.no_grad():
        for p in agent.model.parameters():  # type: ignore[attr-defined]
            p.mul_(-1.0)  # now a different policy: its argmax actions flip
    with pytest.raises(ExportError, match="differ from the framework's"):
        _check(agent, info.path, "onnx", 64, np.random.default_rng(0))


def _evaluate(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / "evaluate.py"), f"hydra.run.dir={tmp_path / 'h'}", *overrides],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )


def test_evaluate_py_exports_and_names_what_it_cannot(cartpole: Path, tmp_path: Path) -> None:
    latest = cartpole / "checkpoints" / "latest"
    proc = _evaluate(
        tmp_path, f"ckpt={latest}", "export=onnx", f"export_path={tmp_path / 'p.onnx'}"
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "wrote " in proc.stdout
        and "inputs: obs float32['N', 4], episode_start bool['N']" in proc.stdout
    )
    assert (tmp_path / "p.onnx").is_file() and (tmp_path / "p.onnx.json").is_file()
    assert "Warning" not in proc.stderr  # the exporter's chatter is kept off the console
    proc = _evaluate(tmp_path, f"ckpt={latest}", "export=torchscript")  # a refused setting: exit 1
    assert proc.returncode == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert "torch.jit is deprecated" in proc.stderr and "Traceback" not in proc.stderr
    for args, named in [  # (the same check in this process: each names what it cannot do)
        ((f"ckpt={latest}", "export=tflite"), "export: expected one of onnx, pt2"),
        ((f"ckpt='{cartpole}/checkpoints/*.pt'", "export=onnx"), "exports one checkpoint"),
        (("export=onnx",), "give the checkpoint"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(named)):
            rl.evaluate(*args, f"hydra.run.dir={tmp_path / 'h'}")


class NestedStatePolicy(PolicyBase):
    """A recurrent policy whose state is nested (``{"core": {"h"}}``, ``{"steps"}``)."""

    def __init__(self, *, observation_space, action_space, hidden: int = 8) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = torch.nn.GRUCell(int(np.prod(observation_space["obs"].shape)), hidden)
        self.actor, self.critic = ActionHead(action_space, hidden), torch.nn.Linear(hidden, 1)

    def initial_state(self, num_envs: int, device: torch.device | str = "cpu") -> TensorDict:
        return TensorDict(
            {"core": {"h": torch.zeros(num_envs, self.hidden)}, "steps": torch.zeros(num_envs)},
            [num_envs],
            device=device,
        )

    def forward(self, obs, episode_starts, state):
        h, steps, outs = state["core", "h"], state["steps"], []
        for t in range(episode_starts.shape[0]):
            keep = (~episode_starts[t]).float()
            h = self.cell(obs["obs"][t].float(), h * keep[:, None])
            steps = steps * keep + 1
            outs.append(h + 0.01 * steps[:, None])
        x = torch.stack(outs)
        after = TensorDict({"core": {"h": h}, "steps": steps}, [h.shape[0]])
        return PolicyOutput(self.actor(x), self.critic(x)[..., 0]), after


def test_a_nested_state_is_exported_leaf_by_leaf(tmp_path: Path) -> None:
    torch.manual_seed(0)
    env = build_env({"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1"})
    model = NestedStatePolicy(observation_space=dict_space(env.observation_space),
                              action_space=env.action_space)  # fmt: skip
    agent = InferenceAgent(model=model, observation_space=env.observation_space,
                           action_space=env.action_space)  # fmt: skip
    info = export_policy(agent, tmp_path / "nested.onnx", "onnx")  # (checked on 32 inputs)
    assert [d["name"] for d in info.inputs] == [
        "obs",
        "episode_start",
        "state.core.h",
        "state.steps",
    ]
    session = ort.InferenceSession(str(info.path), providers=["CPUExecutionProvider"])
    h, steps = np.zeros((1, 8), np.float32), np.zeros(1, np.float32)
    obs, _ = env.reset(seed=0)
    agent.reset()
    for t in range(20):
        feed = {"obs": obs[None].astype(np.float32), "episode_start": np.array([t == 0]),
                "state.core.h": h, "state.steps": steps}  # fmt: skip
        action, h, steps = session.run(None, feed)
        assert int(action[0]) == agent.act(obs)
        obs, _, terminated, truncated, _ = env.step(int(action[0]))
        if terminated or truncated:
            break
