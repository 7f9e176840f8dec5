"""Advantage estimators are configured objects: the shipped ones by name, a researcher's own by
its ``_target_`` (this module's ``ScaledTD``, one class and one config entry, nothing else), and
saved configs from before the estimator was an object still load
(:mod:`rl.checkpoints.migrations`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from pipelines import ppo_pipeline
from tensordict import TensorDict
from torch import nn

import rl.engine.run
from rl.checkpoints.migrations import migrate
from rl.checkpoints.saved_config import rebuild_config
from rl.engine.settings import verify_train_cfg
from rl.losses import PPOLoss
from rl.pipeline import PipelineStage
from rl.storage import GAE, DiscountedReturns, RolloutStorage, compute_gae
from rl.utils.config import ConfigError


@dataclasses.dataclass(frozen=True)
class ScaledTD:
    """A researcher's estimator: one-step TD errors, scaled; targets = advantages + values."""

    scale: float = 1.0

    def __call__(
        self, storage: RolloutStorage, *, model: nn.Module, next_value: torch.Tensor, gamma: float
    ) -> Mapping[str, float]:
        steps = storage.recorded()
        adv, _ = compute_gae(
            rewards=steps["rewards"],
            values=steps["values"],
            next_value=next_value,
            terminated=steps["terminated"],
            truncated=steps["truncated"],
            truncation_values=steps["truncation_values"],
            gamma=gamma,
            gae_lambda=0.0,
        )
        adv = self.scale * adv
        storage.set_advantages(adv, adv + steps["values"])
        return {"losses/td/mean_abs": float(adv.abs().mean()), "losses/td/envs": adv.shape[1]}


def _storage(t: int = 5, n: int = 3) -> RolloutStorage:
    g = torch.Generator().manual_seed(0)
    storage = RolloutStorage(num_steps=t, num_envs=n, device="cpu")
    storage.set_first(
        {"x": torch.zeros(n, 2)}, torch.ones(n, dtype=torch.bool), TensorDict({}, [n])
    )
    for i in range(t):
        storage.insert(
            {
                "rewards": torch.rand(n, generator=g),
                "values": torch.rand(n, generator=g),
                "terminated": torch.tensor([i == 2] + [False] * (n - 1)),
                "truncated": torch.zeros(n, dtype=torch.bool),
                "truncation_values": torch.zeros(n),
            },
            {"x": torch.zeros(n, 2)},
        )
    return storage


def test_a_users_estimator_fills_the_rollout() -> None:
    storage = _storage()
    logged = ScaledTD(scale=2.0)(storage, model=nn.Identity(), next_value=torch.ones(3), gamma=0.9)
    steps = storage.recorded()
    one_step, _ = compute_gae(
        rewards=steps["rewards"],
        values=steps["values"],
        next_value=torch.ones(3),
        terminated=steps["terminated"],
        truncated=steps["truncated"],
        truncation_values=steps["truncation_values"],
        gamma=0.9,
        gae_lambda=0.0,
    )
    torch.testing.assert_close(storage["advantages"][:5], 2.0 * one_step)
    assert logged["losses/td/mean_abs"] == pytest.approx(float((2.0 * one_step).abs().mean()))


def test_set_advantages_names_a_wrong_shape() -> None:
    storage = _storage()
    with pytest.raises(ValueError, match=r"rollout advantages: expected shape \(5, 3\)"):
        storage.set_advantages(torch.zeros(5, 3, 1), torch.zeros(5, 3))


def _users_conf(tmp_path: Path, body: str) -> str:
    """A researcher's config folder with ``pipeline/advantage/scaled_td.yaml``; its override."""
    folder = tmp_path / "my_conf" / "pipeline" / "advantage"
    folder.mkdir(parents=True)
    (folder / "scaled_td.yaml").write_text(body)
    return f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"


def test_a_users_estimator_trains_from_the_config(compose_cfg, tmp_path: Path) -> None:
    yaml = "_target_: tests.test_advantage_estimators.ScaledTD\nscale: 0.5\n"
    cfg = compose_cfg(
        [
            "+experiment=ppo_classic_control",
            "+debug=smoke",
            _users_conf(tmp_path, yaml),
            "pipeline/advantage=scaled_td",
            "logger.sinks.console.progress_bar=false",
            "eval.num_episodes=0",
        ]
    )
    assert cfg.pipeline.advantage == {"_target_": "tests.test_advantage_estimators.ScaledTD",
                                      "scale": 0.5}  # fmt: skip
    metrics = rl.engine.run.train(cfg)
    # It ran on every rollout (its scalars are logged with the update's).
    assert metrics["losses/td/envs"] == cfg.sampler.num_envs
    assert metrics["losses/td/mean_abs"] > 0.0


def test_an_estimators_arguments_are_checked_before_the_run(
    compose_cfg, resolve_cfg, tmp_path: Path
) -> None:
    yaml = "_target_: tests.test_advantage_estimators.ScaledTD\nscael: 2\n"
    plain = resolve_cfg(
        compose_cfg(
            [
                "+experiment=ppo_classic_control",
                _users_conf(tmp_path, yaml),
                "pipeline/advantage=scaled_td",
            ]
        )
    )
    with pytest.raises(ConfigError, match=r"pipeline.advantage.scael: unknown key .*ScaledTD"):
        verify_train_cfg(plain)


def test_a_stage_overrides_the_estimator_and_inherits_the_rest() -> None:
    pipe = ppo_pipeline(
        named_losses={"ppo": PPOLoss()},
        stages=[
            PipelineStage(loss_names=["ppo"], max_stage_steps=64),
            PipelineStage(loss_names=["ppo"], max_stage_steps=64, advantage=DiscountedReturns()),
        ],
        advantage=GAE(gae_lambda=0.8),
    )
    assert pipe.settings_for(0).advantage == GAE(gae_lambda=0.8)
    assert pipe.settings_for(1).advantage == DiscountedReturns()


def test_a_pipeline_without_an_estimator_is_an_error() -> None:
    with pytest.raises(TypeError, match=r"settings missing \(or null\): \['advantage'\]"):
        ppo_pipeline(
            named_losses={"ppo": PPOLoss()},
            stages=[PipelineStage(loss_names=["ppo"], max_stage_steps=64)],
            advantage=None,
        )


# ------------------------------------------------------------------ migrations
OLD_PIPELINE = {
    "_target_": "rl.pipeline.TrainingPipeline",
    "gamma": 0.99,
    "use_gae": True,
    "gae_lambda": 0.9,
    "advantage": "gae",
    "vtrace_rho_bar": 1.0,
    "vtrace_c_bar": 1.0,
    "vtrace_lambda": 1.0,
    "stages": [{"_target_": "rl.pipeline.PipelineStage", "loss_names": ["ppo"]}],
}


@pytest.mark.parametrize(
    ("old", "option", "node"),
    [
        ({}, "gae", {"_target_": "rl.storage.GAE", "gae_lambda": 0.9}),
        ({"use_gae": False}, "returns", {"_target_": "rl.storage.DiscountedReturns"}),
        (
            {"advantage": "vtrace", "vtrace_c_bar": 0.5},
            "vtrace",
            {"_target_": "rl.storage.VTrace", "rho_bar": 1.0, "c_bar": 0.5, "vtrace_lambda": 1.0},
        ),
    ],
)
def test_old_advantage_settings_migrate(old: dict, option: str, node: dict) -> None:
    saved = {"seed": 1, "pipeline": {**OLD_PIPELINE, **old}}
    new, choices = migrate(saved, {"pipeline": "ppo", "task": "nav_small"})
    assert new["pipeline"]["advantage"] == node
    assert not {"use_gae", "gae_lambda", "vtrace_rho_bar"} & set(new["pipeline"])
    assert choices == {"pipeline": "ppo", "task": "nav_small", "pipeline/advantage": option}
    assert saved == {"seed": 1, "pipeline": {**OLD_PIPELINE, **old}}  # not changed in place
    assert migrate(new, choices) == (new, choices)  # today's layout passes unchanged


def test_a_stages_old_overrides_migrate_with_the_pipelines_values() -> None:
    pipe = {**OLD_PIPELINE, "stages": [{"loss_names": ["ppo"], "use_gae": None},
                                       {"loss_names": ["ppo"], "gae_lambda": 0.5}]}  # fmt: skip
    new, _ = migrate({"pipeline": pipe}, None)
    first, second = new["pipeline"]["stages"]
    assert first == {"loss_names": ["ppo"]}
    assert second == {
        "loss_names": ["ppo"],
        "advantage": {"_target_": "rl.storage.GAE", "gae_lambda": 0.5},
    }


def test_an_old_vtrace_run_rebuilds_on_todays_tree(compose_cfg, resolve_cfg) -> None:
    today = resolve_cfg(compose_cfg(["+experiment=ppo_nav", "pipeline/advantage=vtrace"]))
    old = dict(today)
    pipe = {k: v for k, v in today["pipeline"].items() if k != "advantage"}
    old["pipeline"] = {**pipe, "advantage": "vtrace", "vtrace_rho_bar": 2.0, "use_gae": True}
    choices = {"experiment": "ppo_nav", "pipeline": "ppo"}
    rebuilt = rebuild_config(old, choices, "old.pt")  # no refusal: the tree names VTrace there
    assert rebuilt.config["pipeline"]["advantage"] == {
        "_target_": "rl.storage.VTrace", "rho_bar": 2.0, "c_bar": 1.0, "vtrace_lambda": 1.0
    }  # fmt: skip
    assert rebuilt.choices["pipeline/advantage"] == "vtrace"


def test_a_saved_pipeline_without_a_setting_gets_the_default_it_ran_with() -> None:
    pipe = {"_target_": "rl.pipeline.TrainingPipeline", "num_steps": 16, "stages": []}
    new, _ = migrate({"pipeline": pipe}, None)
    assert new["pipeline"]["num_steps"] == 16  # its own
    assert new["pipeline"]["recurrence"] == 0 and new["pipeline"]["save_interval"] == 0
    assert new["pipeline"]["advantage"] == {"_target_": "rl.storage.GAE", "gae_lambda": 0.95}
    other = {"_target_": "my_pkg.Pipeline", "stages": []}  # not ours: left as it is
    assert migrate({"pipeline": other}, None)[0] == {"pipeline": other}
