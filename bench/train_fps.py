"""Training throughput: this project's PPO vs stable-baselines3's PPO on the same task.

Both train on the registered ``rl/PointNav-v0`` task (19x19) with the same rollout length,
env count, epochs and minibatches, one torch thread each. Ours runs ``ppo_nav`` with its GRU
policy and with a memoryless MLP equivalent to SB3's (flattened observation, separate 64-64
tanh actor and critic networks). FPS = env steps / wall time over the last three quarters of
training (the first quarter is warm-up, for both).

    python bench/train_fps.py [--steps 40960] [--skip-sb3]
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES = 16, 128, 4, 4


def ours(
    model: str, steps: int, extra_overrides: list[str] | None = None, return_record: bool = False
) -> Any:
    """Training FPS of ppo_nav with ``model`` (and the last metrics record if asked)."""
    from hydra import compose, initialize_config_dir

    import rl.engine.run

    with tempfile.TemporaryDirectory() as tmp:
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose(
                config_name="train",
                overrides=[
                    "+experiment=ppo_nav",
                    f"model={model}",
                    f"total_env_steps={steps}",
                    f"sampler.num_envs={NUM_ENVS}",
                    f"pipeline.num_steps={NUM_STEPS}",
                    f"pipeline.update_repeats={EPOCHS}",
                    f"pipeline.num_mini_batch={MINIBATCHES}",
                    "pipeline.save_interval=0",
                    f"pipeline.metric_accumulate_interval={steps // 4}",
                    "eval.num_episodes=0",
                    "torch_threads=1",
                    "logger.sinks.console.progress_bar=false",
                    "logger.sinks.console.summary_every=0",
                    f"output_dir={tmp}",
                    *(extra_overrides or []),
                ],
            )
        rl.engine.run.train(cfg)
        lines = (Path(tmp) / "metrics.jsonl").read_text().splitlines()
        first, last = json.loads(lines[0]), json.loads(lines[-1])
        # The first quarter is warm-up (first backward, optimizer state, caches): FPS is
        # measured over the last three quarters.
        fps = (last["env_step"] - first["env_step"]) / (last["wall_time"] - first["wall_time"])
        return (fps, last.get("metrics", last)) if return_record else fps


def sb3(steps: int, vec_env: str = "dummy") -> float:
    """SB3 PPO's training FPS with ``DummyVecEnv`` (``dummy``) or ``SubprocVecEnv``."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    import rl.tasks  # noqa: F401  (registers rl/PointNav-v0)

    class DictFlatten(BaseFeaturesExtractor):
        """Concatenate every entry flattened (the same input our MLP sees)."""

        def __init__(self, observation_space: gym.spaces.Dict) -> None:
            size = sum(int(torch.tensor(s.shape).prod()) for s in observation_space.values())
            super().__init__(observation_space, features_dim=size)

        def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.cat([obs[k].flatten(1).float() for k in sorted(obs)], dim=1)

    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    vec_cls = SubprocVecEnv if vec_env == "subproc" else DummyVecEnv
    kwargs = {"start_method": "forkserver"} if vec_env == "subproc" else None
    # A picklable factory: SubprocVecEnv's workers must register rl/PointNav-v0 themselves.
    make = functools.partial(rl.tasks.make_gym_env, env_id="rl/PointNav-v0")
    env = make_vec_env(make, n_envs=NUM_ENVS, seed=0, vec_env_cls=vec_cls, vec_env_kwargs=kwargs)
    agent = PPO(
        "MultiInputPolicy",
        env,
        n_steps=NUM_STEPS,
        batch_size=NUM_STEPS * NUM_ENVS // MINIBATCHES,
        n_epochs=EPOCHS,
        learning_rate=5e-4,
        ent_coef=0.01,
        policy_kwargs=dict(
            features_extractor_class=DictFlatten,
            net_arch=dict(pi=[64, 64], vf=[64, 64]),
            activation_fn=torch.nn.Tanh,
            normalize_images=False,
        ),
        device="cpu",
        seed=0,
        verbose=0,
    )
    # Warm up like ours (first quarter excluded), then time the remaining three quarters.
    agent.learn(total_timesteps=steps // 4)
    warm = agent.num_timesteps
    start = time.perf_counter()
    agent.learn(total_timesteps=steps - warm, reset_num_timesteps=False)
    elapsed = time.perf_counter() - start
    env.close()
    return (agent.num_timesteps - warm) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=NUM_ENVS * NUM_STEPS * 20)
    parser.add_argument("--skip-sb3", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [
        ("ours ppo_nav, GRU policy (nav_cnn_gru)", ours("nav_cnn_gru", args.steps)),
        ("ours ppo_nav, memoryless CNN (nav_cnn)", ours("nav_cnn", args.steps)),
        ("ours ppo_nav, memoryless MLP (mlp)", ours("mlp", args.steps)),
    ]
    if not args.skip_sb3:
        rows.append(("stable-baselines3 PPO, MLP, DummyVecEnv", sb3(args.steps)))
    print(
        f"\ntraining FPS on rl/PointNav-v0, {args.steps:,} env steps each "
        f"({NUM_ENVS} envs x {NUM_STEPS} steps, {EPOCHS} epochs x {MINIBATCHES} minibatches, "
        "1 torch thread)"
    )
    for name, fps in rows:
        print(f"  {name:<44} {fps:>8,.0f} FPS")


if __name__ == "__main__":
    main()
