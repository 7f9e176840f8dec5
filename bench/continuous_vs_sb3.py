"""Continuous control: this project's PPO vs stable-baselines3 PPO on Pendulum-v1, matched.

Both train on ``Pendulum-v1`` with the same budget and seed and the same hyperparameters (ours:
``+experiment=ppo_continuous``; SB3: ``PPO("MlpPolicy")`` given that experiment's settings): 8
envs x 256 steps per rollout, 10 epochs of 32 minibatches of 64 single steps, Adam lr 1e-3 and
clip range 0.2 both decayed linearly to 0 over the budget, clipped value loss (SB3:
``clip_range_vf`` on the same schedule), no entropy bonus, value coefficient 0.5 (SB3: 0.25, see
below), max grad norm 0.5, gamma 0.9, GAE lambda 0.95, advantages normalised per minibatch, a
Gaussian MLP (separate 64-64 tanh actor and critic, state-independent log-std from 0, orthogonal
init), observations and rewards normalised VecNormalize-style (clip 10; SB3: ``VecNormalize``
over a ``DummyVecEnv``), one torch thread. The composed config is checked against what SB3 is
given (``MATCHED``): a change to the experiment stops the benchmark rather than unmatching the
two sides silently.

Printed for each: the final evaluation return (20 episodes, deterministic = the Gaussian's mean,
observations normalised with the frozen training statistics; ours: the engine's own final
``eval/episodic_return``, episode seeds 1,000,000 + i; SB3: ``evaluate_policy`` on a fresh
``VecNormalize(training=False, norm_reward=False)`` env holding the trained statistics, seeded
1,000,000) and the training FPS = env steps / wall time over the last three quarters of training
(the first quarter is warm-up, as in ``bench/train_fps.py``; ours from its metrics records, SB3
from a callback within one ``learn`` call, so that its schedules decay over the whole budget);
then FPS ours / SB3 and the difference of the returns (ours - SB3).

Not identical by construction: the value loss's form (ours, CleanRL's: 0.5 * max(unclipped,
clipped) squared error; SB3's: the clipped one only, without the 0.5, so SB3 gets vf_coef 0.25
for the same weight), the evaluation episodes' initial states (same seed range, different
streams), and Adam's implementation (the experiment's fused Adam, SB3's default: the same
algorithm).

``--smoke``: tiny budgets (4,096 env steps each, i.e. two rollouts, FPS over the second; 2
evaluation episodes), to check that the benchmark runs (``tests/test_bench.py``), not to measure.

    python bench/continuous_vs_sb3.py [--steps 500000] [--seed 1] [--eval-episodes 20]
                                      [--skip-sb3] [--smoke]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import train_fps  # noqa: E402  (compose_run: the config train.py would run)

EXPERIMENT = "ppo_continuous"
ENV_ID = "Pendulum-v1"
NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES = 8, 256, 10, 32
BATCH_SIZE = NUM_ENVS * NUM_STEPS // MINIBATCHES  # 64 single steps (pipeline.recurrence=1)
LR, CLIP, GAMMA, GAE_LAMBDA = 1e-3, 0.2, 0.9, 0.95
ENT_COEF, VF_COEF, MAX_GRAD_NORM, NORM_CLIP = 0.0, 0.5, 0.5, 10.0
EVAL_EPISODES = 20
EVAL_SEED = 1_000_000  # SB3's evaluation env (ours: eval.episode_seed), apart from training's
# --smoke's defaults: two rollouts each (the FPS is the second's), two evaluation episodes.
SMOKE = {"steps": 2 * NUM_ENVS * NUM_STEPS, "eval_episodes": 2}

# Our composed config's keys and the values SB3 is given below (checked before training).
MATCHED: dict[str, Any] = {
    "task.env_id": ENV_ID,
    "sampler.num_envs": NUM_ENVS,
    "pipeline.num_steps": NUM_STEPS,
    "pipeline.update_repeats": EPOCHS,
    "pipeline.num_mini_batch": MINIBATCHES,
    "pipeline.recurrence": 1,
    "pipeline.optimizer.lr": LR,
    "pipeline.lr_scheduler.lr_lambda.endp": 0.0,
    "pipeline.named_losses.ppo.clip_param": CLIP,
    "pipeline.named_losses.ppo.clip_decay.endp": 0.0,
    "pipeline.named_losses.ppo.use_clipped_value_loss": True,
    "pipeline.named_losses.ppo.entropy_coef": ENT_COEF,
    "pipeline.named_losses.ppo.value_loss_coef": VF_COEF,
    "pipeline.named_losses.ppo.normalize_advantage": True,
    "pipeline.max_grad_norm": MAX_GRAD_NORM,
    "pipeline.gamma": GAMMA,
    "pipeline.advantage.gae_lambda": GAE_LAMBDA,
    "model.head_layers": [64, 64],
    "model.activation": "tanh",
    "model.log_std_init": 0.0,
    "normalize.observations": True,
    "normalize.rewards": True,
    "normalize.clip": NORM_CLIP,
    "normalize.gamma": None,  # null: the stage's discount, pipeline.gamma (GAMMA, above)
    "eval.deterministic": True,
}


def check_matched(cfg: DictConfig) -> None:
    """Stop if our composed config no longer has the settings SB3 is given (``MATCHED``)."""
    wrong = []
    for key, expected in MATCHED.items():
        value = OmegaConf.select(cfg, key)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        if value != expected:
            wrong.append(f"{key}={value!r} (SB3 gets {expected!r})")
    if wrong:
        raise SystemExit(f"+experiment={EXPERIMENT} no longer matches SB3's side: {wrong}")


def ours(steps: int, seed: int, eval_episodes: int) -> tuple[float, float]:
    """``+experiment=ppo_continuous``: (final eval return, training FPS).

    Composed and run as ``train_fps.ours`` does, but with the final evaluation on (its record,
    written after the last training record, is left out of the FPS).
    """
    import rl.engine.run

    with tempfile.TemporaryDirectory() as tmp:
        cfg = train_fps.compose_run(
            EXPERIMENT,
            [
                f"task.env_id={ENV_ID}",
                f"total_env_steps={steps}",
                f"seed={seed}",
                "pipeline.save_interval=0",
                f"pipeline.metric_accumulate_interval={steps // 4}",
                f"eval.num_episodes={eval_episodes}",
                "torch_threads=1",
                "logger.sinks.console.progress_bar=false",
                "logger.sinks.console.summary_every=0",
                f"output_dir={tmp}",
            ],
        )
        check_matched(cfg)
        metrics = rl.engine.run.train(cfg)
        lines = (Path(tmp) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    training = [r for r in records if not any(str(k).startswith("eval/") for k in r)]
    first, last = training[0], training[-1]
    # The first quarter is warm-up: FPS over the last three quarters (as train_fps).
    fps = (last["env_step"] - first["env_step"]) / (last["wall_time"] - first["wall_time"])
    return float(metrics["eval/episodic_return"]), float(fps)


def sb3(steps: int, seed: int, eval_episodes: int) -> tuple[float, float]:
    """stable-baselines3 PPO with the same settings: (final eval return, training FPS)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.utils import LinearSchedule
    from stable_baselines3.common.vec_env import VecNormalize

    class Clock(BaseCallback):  # type: ignore[misc]
        """Env steps and time at the first rollout from a quarter of ``steps`` on, and at the end.

        One ``learn`` call (not train_fps's two): SB3's schedules then decay over all ``steps``.
        """

        def __init__(self) -> None:
            super().__init__()
            self.start: tuple[int, float] | None = None
            self.end: tuple[int, float] | None = None

        def _on_rollout_start(self) -> None:
            if self.start is None and self.model.num_timesteps >= steps // 4:
                self.start = (self.model.num_timesteps, time.perf_counter())

        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            self.end = (self.model.num_timesteps, time.perf_counter())

    def linear(start: float) -> LinearSchedule:
        return LinearSchedule(start, 0.0, 1.0)  # start -> 0 over the whole budget

    env = VecNormalize(
        make_vec_env(ENV_ID, n_envs=NUM_ENVS, seed=seed),  # DummyVecEnv
        norm_obs=True,
        norm_reward=True,
        clip_obs=NORM_CLIP,
        clip_reward=NORM_CLIP,
        gamma=GAMMA,
    )
    agent = PPO(
        "MlpPolicy",
        env,
        n_steps=NUM_STEPS,
        batch_size=BATCH_SIZE,
        n_epochs=EPOCHS,
        learning_rate=linear(LR),
        clip_range=linear(CLIP),
        clip_range_vf=linear(CLIP),  # SB3 clips the value loss only when this is set
        ent_coef=ENT_COEF,
        # Ours (CleanRL's) is value_loss_coef * 0.5 * squared error; SB3's is vf_coef * squared
        # error: half the coefficient gives the value term the same weight.
        vf_coef=VF_COEF / 2,
        max_grad_norm=MAX_GRAD_NORM,
        gamma=GAMMA,
        gae_lambda=GAE_LAMBDA,
        policy_kwargs=dict(
            net_arch=dict(pi=[64, 64], vf=[64, 64]),
            activation_fn=torch.nn.Tanh,
            log_std_init=0.0,
            ortho_init=True,
        ),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    clock = Clock()
    agent.set_logger(Logger(None, []))  # (SB3's default makes a /tmp/SB3-<time> folder)
    agent.learn(total_timesteps=steps, callback=clock)
    assert clock.start is not None and clock.end is not None, "fewer than two rollouts"
    fps = (clock.end[0] - clock.start[0]) / (clock.end[1] - clock.start[1])
    # Evaluation: a fresh env on other seeds, normalised with the frozen training statistics.
    eval_env = VecNormalize(
        make_vec_env(ENV_ID, n_envs=1, seed=EVAL_SEED),
        training=False,
        norm_obs=True,
        norm_reward=False,
        clip_obs=NORM_CLIP,
        gamma=GAMMA,
    )
    eval_env.obs_rms = copy.deepcopy(env.obs_rms)
    mean_return, _ = evaluate_policy(
        agent, eval_env, n_eval_episodes=eval_episodes, deterministic=True
    )
    env.close()
    eval_env.close()
    assert isinstance(mean_return, float)  # np.float64 (the episode returns were not asked for)
    return float(mean_return), float(fps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500_000, help="env steps for each side")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-episodes", type=int, default=EVAL_EPISODES)
    parser.add_argument("--skip-sb3", action="store_true", help="skip the SB3 row")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.steps < SMOKE["steps"]:
        parser.error(f"--steps must cover at least two rollouts ({SMOKE['steps']:,} env steps)")
    if args.eval_episodes < 1:
        parser.error("--eval-episodes must be at least 1")
    torch.set_num_threads(1)
    rows = {
        "ours (+experiment=ppo_continuous)": ours(args.steps, args.seed, args.eval_episodes),
    }
    if not args.skip_sb3:
        rows["stable-baselines3 PPO (VecNormalize)"] = sb3(
            args.steps, args.seed, args.eval_episodes
        )
    print(
        f"\nPPO on {ENV_ID}, {args.steps:,} env steps each ({NUM_ENVS} envs x {NUM_STEPS} steps, "
        f"{EPOCHS} epochs x {MINIBATCHES} minibatches of {BATCH_SIZE}, 1 torch thread), "
        f"seed {args.seed}"
    )
    for name, (ret, fps) in rows.items():
        print(f"  {name:<42} eval return {ret:>8.1f} {fps:>7,.0f} FPS")
    if not args.skip_sb3:
        (ours_ret, ours_fps), (sb3_ret, sb3_fps) = rows.values()
        print("ratios")
        print(f"  {'FPS ours / SB3:':<20}{ours_fps / sb3_fps:>8.2f}x")
        print(f"  {'return ours - SB3:':<20}{ours_ret - sb3_ret:>+8.1f}")


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
