"""Parts of one's own, chosen in the config, in place of ``ActorCritic``'s built-in ones.

``TinyConv`` is a researcher's encoder for PointNav's 7x7 ``image`` entry; through the config
(an override, or one YAML in a folder of one's own on Hydra's search path) it replaces
``ActorCritic``'s CNN, trains end to end, and its checkpoint is evaluated from the same folder
(issue 50: models from parts, a new encoder is one class and one YAML). ``LeakyCore`` is a
researcher's recurrent core (a leaky integrator) in place of the GRU, the same way, and
``GatedHead`` a network of one's own in place of a head's MLP (the actor's, the critic's, a
centralised critic's).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict
from torch import nn

from rl.checkpoints import latest_checkpoint, load_checkpoint
from rl.checkpoints.files import UntrustedCheckpointError
from rl.engine import run
from rl.utils.config import ConfigError

SMOKE = ["+experiment=ppo_nav", "+debug=smoke", "task=nav_small", "eval.num_episodes=2",
         "logger.sinks.console.progress_bar=false"]  # fmt: skip


class TinyConv(nn.Module):
    """One 3x3 convolution over the image's channel values, pooled: ``[B, H, W, C]`` uint8."""

    def __init__(self, space: gym.spaces.Box, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(space.shape[-1], channels, 3)
        self.out_size = channels
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        x = x.permute(0, 3, 1, 2).float() / 10.0
        return torch.relu(self.conv(x)).mean(dim=(2, 3))


class LeakyCore(nn.Module):
    """A leaky integrator of the trunk's features: ``m <- decay * m + tanh(W x)``.

    ``m`` is zero at an episode start.
    """

    def __init__(self, input_size: int, size: int = 16, decay: float = 0.5) -> None:
        super().__init__()
        self.proj, self.out_size, self.decay = nn.Linear(input_size, size), size, decay

    def initial_state(self, num_envs: int, device: torch.device | str) -> TensorDict:
        return TensorDict({"m": torch.zeros(num_envs, self.out_size, device=device)}, [num_envs])

    def forward(
        self, x: torch.Tensor, episode_starts: torch.Tensor, state: TensorDict
    ) -> tuple[torch.Tensor, TensorDict]:
        m, outs = state["m"], []
        for t in range(x.shape[0]):
            m = torch.where(episode_starts[t, :, None], torch.zeros_like(m), m)
            m = self.decay * m + torch.tanh(self.proj(x[t]))
            outs.append(m)
        return torch.stack(outs), TensorDict({"m": m}, [x.shape[1]])


class NoSize(nn.Module):
    def __init__(self, space: gym.Space) -> None:
        super().__init__()


def test_an_encoder_from_the_config_trains_end_to_end(
    compose_cfg: Callable, tmp_path: Path
) -> None:
    encoder = "{image:{_target_:tests.test_model_parts.TinyConv,_partial_:true,channels:6}}"
    metrics = run.train(compose_cfg([*SMOKE, f"model.encoders={encoder}"]))
    assert metrics["eval/episodic_length"] > 0
    weights = load_checkpoint(latest_checkpoint(tmp_path / "run"))["model"]
    assert tuple(weights["encoders.image.conv.weight"].shape) == (6, 3, 3, 3)
    assert not [k for k in weights if k.startswith("encoders.image.net")]  # (not the built-in)
    # Typed as a value, not named by a config tree: its checkpoint builds it only for a user
    # who trusts it (a file never chooses what code runs).
    evaluate = ["num_episodes=2", "num_envs=2", "progress_bar=false",
                f"run_dir={tmp_path / 'run'}", f"output_dir={tmp_path / 'eval_out'}"]  # fmt: skip
    with pytest.raises(UntrustedCheckpointError, match=r"model\.encoders\.image\._target_"):
        run.evaluate(compose_cfg(evaluate, config_name="evaluate"))
    trusted = "trusted_targets=[tests.test_model_parts.TinyConv]"
    assert run.evaluate(compose_cfg([*evaluate, trusted], config_name="evaluate"))


def test_an_encoder_is_one_class_and_one_yaml_in_ones_own_folder(
    compose_cfg: Callable, tmp_path: Path
) -> None:
    folder = tmp_path / "my_conf" / "model" / "encoder"
    folder.mkdir(parents=True)
    (folder / "tiny_conv.yaml").write_text(
        "_target_: tests.test_model_parts.TinyConv\n_partial_: true\nchannels: 4\n"
    )
    search = f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"
    choose = "+model/encoder@model.encoders.image=tiny_conv"
    run.train(compose_cfg([*SMOKE, search, choose]))
    ckpt = latest_checkpoint(tmp_path / "run")
    state = load_checkpoint(ckpt)
    assert tuple(state["model"]["encoders.image.conv.weight"].shape) == (4, 3, 3, 3)
    # Evaluated from the same folder: the tree names the encoder, the file does not choose it.
    evaluate = ["num_episodes=2", "num_envs=2", "progress_bar=false", f"ckpt={ckpt}",
                f"output_dir={tmp_path / 'eval_out'}", search]  # fmt: skip
    assert run.evaluate(compose_cfg(evaluate, config_name="evaluate"))["eval/episodic_length"] > 0


@pytest.mark.parametrize(
    ("encoders", "message"),
    [
        ("{goal_typo:{_target_:tests.test_model_parts.TinyConv,_partial_:true}}",
         r"model.encoders: \['goal_typo'\] are not observation entries the actor sees"),
        ("{image:{_target_:tests.test_model_parts.NoSize,_partial_:true}}",
         r"model.encoders.image: NoSize needs an integer out_size >= 1"),
        ("{image:{_target_:tests.test_model_parts.TinyConv,_partial_:true,chanels:3}}",
         r"model.encoders.image.chanels: unknown key for tests.test_model_parts.TinyConv"),
    ],
)  # fmt: skip
def test_a_wrong_encoder_is_named_before_training(
    compose_cfg: Callable, encoders: str, message: str
) -> None:
    with pytest.raises((ConfigError, ValueError, TypeError), match=message):
        run.train(compose_cfg([*SMOKE, f"model.encoders={encoders}"]))


CORE = "{_target_:tests.test_model_parts.LeakyCore,_partial_:true,size:12}"


def test_a_core_from_the_config_trains_end_to_end(compose_cfg: Callable, tmp_path: Path) -> None:
    metrics = run.train(compose_cfg([*SMOKE, "model.rnn=null", f"model.core={CORE}"]))
    assert metrics["eval/episodic_length"] > 0
    state = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert tuple(state["model"]["rnn.proj.weight"].shape)[0] == 12  # the core's, not a GRU's
    assert set(state["rollout"]["state"]) == {"m"}  # the carried state is the core's own
    evaluate = ["num_episodes=2", "num_envs=2", "progress_bar=false",
                f"run_dir={tmp_path / 'run'}", f"output_dir={tmp_path / 'eval_out'}",
                "trusted_targets=[tests.test_model_parts.LeakyCore]"]  # fmt: skip
    assert run.evaluate(compose_cfg(evaluate, config_name="evaluate"))


def test_a_core_is_one_class_and_one_yaml_in_ones_own_folder(
    compose_cfg: Callable, tmp_path: Path
) -> None:
    folder = tmp_path / "my_conf" / "model" / "core"
    folder.mkdir(parents=True)
    (folder / "leaky.yaml").write_text(
        "_target_: tests.test_model_parts.LeakyCore\n_partial_: true\nsize: 10\n"
    )
    search = f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"
    run.train(compose_cfg([*SMOKE, search, "+model/core@model.core=leaky", "model.rnn=null"]))
    state = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert tuple(state["model"]["rnn.proj.weight"].shape)[0] == 10


def test_a_core_beside_the_built_in_rnn_is_named_before_training(compose_cfg: Callable) -> None:
    with pytest.raises((ConfigError, ValueError), match=r"model.core replaces the built-in "
                       r"recurrent core: set model.rnn=null \(it is 'gru'\)"):  # fmt: skip
        run.train(compose_cfg([*SMOKE, f"model.core={CORE}"]))


class GatedHead(nn.Module):
    """A head of one's own: a gated linear unit over its input, ``[B, F] -> [B, size]``."""

    def __init__(self, input_size: int, size: int = 16) -> None:
        super().__init__()
        self.proj, self.out_size = nn.Linear(input_size, 2 * size), size
        self.input_size = input_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.glu(self.proj(x), dim=-1)


def test_heads_from_the_config_train_end_to_end(compose_cfg: Callable, tmp_path: Path) -> None:
    head = "{_target_:tests.test_model_parts.GatedHead,_partial_:true,size:%d}"
    overrides = [f"model.policy_head={head % 6}", f"model.value_head={head % 5}"]
    metrics = run.train(compose_cfg([*SMOKE, *overrides]))
    assert metrics["eval/episodic_length"] > 0
    weights = load_checkpoint(latest_checkpoint(tmp_path / "run"))["model"]
    # Each head takes the core's output (the GRU's state size), and the built-in layers follow.
    hidden = weights["rnn.weight_hh_l0"].shape[1]
    assert tuple(weights["actor.proj.weight"].shape) == (12, hidden)
    assert tuple(weights["critic.proj.weight"].shape) == (10, hidden)
    assert tuple(weights["critic_out.weight"].shape) == (1, 5)  # the value layer follows it


def test_a_centralised_critics_head_reads_the_critic_entries() -> None:
    from rl.models import ActorCritic

    space = gym.spaces.Dict(
        {"own": gym.spaces.Box(-1, 1, (3,)), "state": gym.spaces.Box(-1, 1, (2, 4))}
    )
    model = ActorCritic(
        observation_space=space, action_space=gym.spaces.Discrete(2), rnn=None,
        trunk_layers=[8], critic_keys=["state"],
        value_head=lambda input_size: GatedHead(input_size, 3),
    )  # fmt: skip
    assert model.critic.input_size == 8  # the global state's 2 x 4, not the actor's features
    obs = {"own": torch.zeros(1, 5, 3), "state": torch.ones(1, 5, 2, 4)}
    out, _ = model(obs, torch.zeros(1, 5, dtype=torch.bool), model.initial_state(5, "cpu"))
    assert out.values.shape == (1, 5)


class NoSizeHead(nn.Module):
    def __init__(self, input_size: int) -> None:
        super().__init__()


@pytest.mark.parametrize(
    ("head", "message"),
    [
        ("NoSizeHead", r"model.policy_head: NoSizeHead needs an integer out_size >= 1"),
        ("NoSize", r"model.policy_head: building a head from \(input_size=...\) failed: "
                   r".*unexpected keyword argument 'input_size'"),
    ],
)  # fmt: skip
def test_a_wrong_head_is_named_before_training(
    compose_cfg: Callable, head: str, message: str
) -> None:
    bad = f"model.policy_head={{_target_:tests.test_model_parts.{head},_partial_:true}}"
    with pytest.raises((ConfigError, TypeError), match=message):
        run.train(compose_cfg([*SMOKE, bad]))
