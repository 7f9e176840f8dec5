"""Training throughput: this project's PPO vs stable-baselines3 and sb3-contrib on one task.

All train on the registered ``rl/PointNav-v0`` task (19x19) with the same rollout length,
env count, epochs and minibatches, one torch thread each. Ours runs ``ppo_nav`` with its CNN+GRU
policy, a memoryless CNN, a memoryless MLP equivalent to SB3's (flattened observation, separate
64-64 tanh actor and critic networks), and a recurrent policy equivalent to sb3-contrib's
``RecurrentPPO`` (every observation entry flattened and concatenated -> GRU 128 -> linear actor
and critic heads; ``RecurrentPPO``: the same input -> one LSTM 128 shared by actor and critic ->
linear heads, BPTT over whole rollout sequences as sb3-contrib does). FPS = env steps / wall
time over the last three quarters of training (the first quarter is warm-up, for all). The raw
environment limit (16 environments stepped serially with random actions, no policy; as in
``bench/sampler_fps.py``) is measured in the same run. The "async" rows add one collection
worker process (``collector=process``) that collects while the learner updates, on the second
core (policy lag 1; networks and settings unchanged).

The "batched" rows step the batched task: all environments in one torch step
(``sampler=batched``, the task's ``BatchedPointNav``), the same networks, epochs and minibatches.
``ppo_nav``'s default layout, 64 envs x 32 steps (the same 2,048 samples an update as the serial
rows), and a wide one, 1,024 envs x 32 steps (32,768 samples an update: 4 minibatches of 8,192),
each row run for at least 8 of its rollouts. The other rows keep 16 serial environments x 128
steps (``sampler=serial``), ``ppo_nav``'s default before the batched task.

``--compile``: every row of ours with ``pipeline.compile=true`` (``torch.compile`` of the update's
forward; the compile time of the first update falls in the warm-up quarter, outside the FPS).

``--smoke``: every row with tiny budgets (512 env steps in 16-step rollouts, 0.25 s of raw
stepping), to check that the benchmark runs (``tests/test_bench.py``), not to measure.

    python bench/train_fps.py [--steps 40960] [--raw-seconds 4] [--skip-sb3] [--skip-async]
                              [--compile] [--smoke]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES = 16, 128, 4, 4
# The batched rows (sampler=batched): ppo_nav's default layout and a wide one, (envs, steps).
BATCHED = {"default": (64, 32), "wide": (1024, 32)}
BATCHED_ROLLOUTS = 8  # a batched row runs for at least this many of its rollouts
SMOKE_BATCHED = (16, 16)  # --smoke: every batched layout 16 envs x 16 steps
SMOKE_NUM_STEPS = 16  # --smoke: rollouts of 16 steps (ours and SB3's alike)
# --smoke's defaults: two such rollouts per row, a quarter of a second of raw stepping.
SMOKE = {"steps": NUM_ENVS * SMOKE_NUM_STEPS * 2, "raw_seconds": 0.25}
# ppo_nav's GRU policy on the flattened observation (no CNN, no trunk), linear heads, and
# full-sequence BPTT (whole 128-step rollouts): the counterpart of sb3-contrib's RecurrentPPO row.
FLAT_GRU = [
    "model.cnn_channels=[]",
    "model.trunk_layers=[]",
    "model.rnn=gru",
    "model.rnn_hidden_size=128",
    "model.rnn_layers=1",
    "model.head_layers=[]",
    "pipeline.recurrence=0",
]
# Overrides of every row of ours (--compile: pipeline.compile=true).
OURS_OVERRIDES: list[str] = []


def ours(
    model: str | None,
    steps: int,
    extra_overrides: list[str] | None = None,
    return_record: bool = False,
    experiment: str = "ppo_nav",
    batched: str | None = None,
) -> Any:
    """Training FPS of ``experiment`` with ``model`` (and the last metrics record if asked).

    ``ppo_nav`` runs with this file's shared settings (epochs, minibatches, and envs and
    rollout: 16 serial environments x 128 steps, or ``BATCHED[batched]`` on the batched task);
    another experiment keeps its own, and ``model=None`` keeps the experiment's model.
    """
    import rl.engine.run

    shared = [
        f"pipeline.update_repeats={EPOCHS}",
        f"pipeline.num_mini_batch={MINIBATCHES}",
    ]
    extra = list(extra_overrides or [])
    if batched:
        envs, rollout = BATCHED[batched]
        steps = max(steps, envs * rollout * BATCHED_ROLLOUTS)
        shared += ["sampler=batched", f"sampler.num_envs={envs}", f"pipeline.num_steps={rollout}"]
    else:
        shared += [f"sampler.num_envs={NUM_ENVS}", f"pipeline.num_steps={NUM_STEPS}"]
        if not any(o.startswith("sampler=") for o in extra):  # serial unless a row picks one
            shared.append("sampler=serial")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_run(
            experiment,
            [
                *([f"model={model}"] if model else []),
                f"total_env_steps={steps}",
                *(shared if experiment == "ppo_nav" else []),
                "pipeline.save_interval=0",
                f"pipeline.metric_accumulate_interval={steps // 4}",
                "eval.num_episodes=0",
                "torch_threads=1",
                "logger.sinks.console.progress_bar=false",
                "logger.sinks.console.summary_every=0",
                f"output_dir={tmp}",
                *OURS_OVERRIDES,
                *extra,
            ],
        )
        rl.engine.run.train(cfg)
        lines = (Path(tmp) / "metrics.jsonl").read_text().splitlines()
        first, last = json.loads(lines[0]), json.loads(lines[-1])
        # The first quarter is warm-up (first backward, optimizer state, caches): FPS is
        # measured over the last three quarters.
        fps = (last["env_step"] - first["env_step"]) / (last["wall_time"] - first["wall_time"])
        return (fps, last.get("metrics", last)) if return_record else fps


def use_smoke_rollouts() -> None:
    """``--smoke``: every row of this file (ours and SB3's) collects 16-step rollouts."""
    global NUM_STEPS, BATCHED_ROLLOUTS
    NUM_STEPS = SMOKE_NUM_STEPS
    BATCHED.update(dict.fromkeys(BATCHED, SMOKE_BATCHED))
    BATCHED_ROLLOUTS = 2
    SB3_SETTINGS.update(n_steps=NUM_STEPS, batch_size=NUM_STEPS * NUM_ENVS // MINIBATCHES)


def _accepted_keys(target: str) -> set[str] | None:
    """The keyword arguments ``target`` takes (None: any, it has ``**kwargs``)."""
    import inspect

    from rl.utils.config import import_target

    params = inspect.signature(import_target(target)).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


# The config-group options each experiment chooses (composed once per experiment).
_CHOICES: dict[str, dict[str, str]] = {}


def compose_run(experiment: str, overrides: list[str]) -> DictConfig:
    """``train.yaml`` with ``+experiment=experiment`` and ``overrides``, as ``train.py`` would.

    With one difference: an override that switches a config group away from the experiment's
    choice (a layout's ``collector=local`` where the experiment runs ``collector=process``) does
    not inherit the keys the experiment set for its own choice that the new one does not take
    (``collector.num_workers``). Hydra merges the experiment's ``collector:`` section into
    whichever collector is chosen; those keys are dropped here, with a note. Keys the new choice
    takes too (``sampler.num_envs`` from ``serial`` to ``multiprocess``) carry over; keys the
    overrides or the new option's own file set are left for the run's config check.
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    def composed(extra: list[str]) -> tuple[dict[str, str], DictConfig]:
        cfg = compose(config_name="train", overrides=extra, return_hydra_config=True)
        choices = dict(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        return choices, cfg

    # The groups the overrides choose an option of (`collector=local`, not `collector.mode=`).
    chosen = {g for g, _, v in (o.partition("=") for o in overrides) if v and g.isidentifier()}
    set_here = {o.partition("=")[0].lstrip("+~") for o in overrides}
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        choices, cfg = composed([f"+experiment={experiment}", *overrides])
        if chosen and experiment not in _CHOICES:
            _CHOICES[experiment] = composed([f"+experiment={experiment}"])[0]
        own = _CHOICES.get(experiment, {})
        for group in sorted(chosen & own.keys()):
            node = cfg[group]
            if choices[group] == own[group] or "_target_" not in node:
                continue
            accepted = _accepted_keys(node["_target_"])
            stale = [
                key
                for key in node
                if accepted is not None
                and not str(key).startswith("_")
                and key not in accepted
                and f"{group}.{key}" not in set_here
            ]
            if stale:  # not those of the new option's own file
                own_file = composed([f"{group}={choices[group]}"])[1][group]
                stale = [key for key in stale if key not in own_file]
            if not stale:
                continue
            with open_dict(node):
                for key in stale:
                    del node[key]
            dropped = ", ".join(f"{group}.{key}" for key in stale)
            print(
                f"  note: {group}={choices[group]} does not take {dropped} (set by {experiment} "
                f"for {group}={own[group]}): dropped",
                flush=True,
            )
    return cfg


def _sb3_env(vec_env: str) -> Any:
    """16 ``rl/PointNav-v0`` environments in SB3's ``DummyVecEnv`` or ``SubprocVecEnv``."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    import rl.tasks

    vec_cls = SubprocVecEnv if vec_env == "subproc" else DummyVecEnv
    kwargs = {"start_method": "forkserver"} if vec_env == "subproc" else None
    # A picklable factory: SubprocVecEnv's workers must register rl/PointNav-v0 themselves.
    make = functools.partial(rl.tasks.make_gym_env, env_id="rl/PointNav-v0")
    return make_vec_env(make, n_envs=NUM_ENVS, seed=0, vec_env_cls=vec_cls, vec_env_kwargs=kwargs)


def _dict_flatten() -> type:
    """SB3 features extractor: every observation entry flattened, concatenated (as ours)."""
    import gymnasium as gym
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class DictFlatten(BaseFeaturesExtractor):
        """Concatenate every entry flattened (the same input our MLP sees)."""

        def __init__(self, observation_space: gym.spaces.Dict) -> None:
            size = sum(int(torch.tensor(s.shape).prod()) for s in observation_space.values())
            super().__init__(observation_space, features_dim=size)

        def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.cat([obs[k].flatten(1).float() for k in sorted(obs)], dim=1)

    return DictFlatten


# What both SB3 rows share with ours: rollout, minibatches, epochs, LR, entropy bonus, CPU.
SB3_SETTINGS: dict[str, Any] = dict(
    n_steps=NUM_STEPS,
    batch_size=NUM_STEPS * NUM_ENVS // MINIBATCHES,
    n_epochs=EPOCHS,
    learning_rate=5e-4,
    ent_coef=0.01,
    device="cpu",
    seed=0,
    verbose=0,
)


def _timed_learn(agent: Any, steps: int) -> float:
    """FPS of ``agent.learn`` over the last three quarters of ``steps`` (warm-up like ours)."""
    from stable_baselines3.common.logger import Logger

    # (its own logger, writing nothing: SB3's default makes a /tmp/SB3-<time> folder per run)
    agent.set_logger(Logger(None, []))
    agent.learn(total_timesteps=steps // 4)
    warm = agent.num_timesteps
    start = time.perf_counter()
    agent.learn(total_timesteps=steps - warm, reset_num_timesteps=False)
    elapsed = time.perf_counter() - start
    agent.get_env().close()
    return float((agent.num_timesteps - warm) / elapsed)


def sb3(steps: int, vec_env: str = "dummy") -> float:
    """SB3 PPO's training FPS with ``DummyVecEnv`` (``dummy``) or ``SubprocVecEnv``."""
    from stable_baselines3 import PPO

    agent = PPO(
        "MultiInputPolicy",
        _sb3_env(vec_env),
        **SB3_SETTINGS,
        policy_kwargs=dict(
            features_extractor_class=_dict_flatten(),
            net_arch=dict(pi=[64, 64], vf=[64, 64]),
            activation_fn=torch.nn.Tanh,
            normalize_images=False,
        ),
    )
    return _timed_learn(agent, steps)


def sb3_recurrent(steps: int) -> float:
    """sb3-contrib ``RecurrentPPO``'s training FPS: flattened input -> LSTM 128 -> linear heads.

    One LSTM shared by actor and critic (``shared_lstm=True``, no separate critic LSTM), no MLP
    after it (``net_arch=[]``), DummyVecEnv; ``batch_size`` is in samples (sb3-contrib cuts
    the rollout's sequences into minibatches of that many steps).
    """
    from sb3_contrib import RecurrentPPO

    agent = RecurrentPPO(
        "MultiInputLstmPolicy",
        _sb3_env("dummy"),
        **SB3_SETTINGS,
        policy_kwargs=dict(
            features_extractor_class=_dict_flatten(),
            lstm_hidden_size=128,
            n_lstm_layers=1,
            shared_lstm=True,
            enable_critic_lstm=False,
            net_arch=[],
            normalize_images=False,
        ),
    )
    return _timed_learn(agent, steps)


def raw_limit(seconds: float) -> float:
    """Env steps/s of 16 environments in our serial sampler, random actions, no policy."""
    sys.path.insert(0, str(ROOT / "bench"))
    import sampler_fps  # this folder's sibling benchmark (its measurement (a), serial)

    return float(sampler_fps.raw_fps("serial", 0, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=NUM_ENVS * NUM_STEPS * 20)
    parser.add_argument("--raw-seconds", type=float, default=4.0)
    parser.add_argument("--skip-sb3", action="store_true", help="skip both SB3 rows")
    parser.add_argument(
        "--skip-async",
        action="store_true",
        help="skip the rows with an asynchronous collection worker (collector=process)",
    )
    parser.add_argument(
        "--compile", action="store_true", help="pipeline.compile=true in every row of ours"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    if args.smoke:  # its defaults; flags given explicitly still win
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        use_smoke_rollouts()
    if args.compile:
        OURS_OVERRIDES.append("pipeline.compile=true")
    torch.set_num_threads(1)
    raw = raw_limit(args.raw_seconds)
    names = {
        "gru": "ours ppo_nav, CNN + GRU policy (nav_cnn_gru)",
        "gru_batched": "ours ppo_nav default, batched, CNN + GRU",
        "gru_wide": "ours batched wide, CNN + GRU",
        "mlp_wide": "ours batched wide, MLP",
        "cnn": "ours ppo_nav, memoryless CNN (nav_cnn)",
        "mlp": "ours ppo_nav, memoryless MLP (mlp)",
        "flat_gru": "ours ppo_nav, flattened -> GRU 128",
        "mlp_async": "ours MLP, async worker (collector=process)",
        "flat_gru_async": "ours flattened -> GRU 128, async worker",
        "sb3": "stable-baselines3 PPO, MLP, DummyVecEnv",
        "sb3_rec": "sb3-contrib RecurrentPPO, flattened -> LSTM 128",
    }
    fps = {
        "gru": ours("nav_cnn_gru", args.steps),
        "cnn": ours("nav_cnn", args.steps),
        "mlp": ours("mlp", args.steps),
        "flat_gru": ours("nav_cnn_gru", args.steps, FLAT_GRU),
        "gru_batched": ours("nav_cnn_gru", args.steps, batched="default"),
        "gru_wide": ours("nav_cnn_gru", args.steps, batched="wide"),
        "mlp_wide": ours("mlp", args.steps, batched="wide"),
    }
    if not args.skip_async:
        # The second core: one collection worker process steps the environments with a policy
        # copy while the learner updates (policy lag 1; the same networks and settings).
        fps["mlp_async"] = ours("mlp", args.steps, ["collector=process"])
        fps["flat_gru_async"] = ours("nav_cnn_gru", args.steps, [*FLAT_GRU, "collector=process"])
    if not args.skip_sb3:
        fps["sb3"] = sb3(args.steps)
        fps["sb3_rec"] = sb3_recurrent(args.steps)
    print(
        f"\ntraining FPS on rl/PointNav-v0, {args.steps:,} env steps each "
        f"({NUM_ENVS} envs x {NUM_STEPS} steps, {EPOCHS} epochs x {MINIBATCHES} minibatches, "
        f"1 torch thread{', compiled update' if args.compile else ''})"
    )
    layouts = ", ".join(f"{name} {e:,} envs x {t} steps" for name, (e, t) in BATCHED.items())
    print(f"  (batched rows: sampler=batched, {layouts}; the same epochs and minibatches)")
    print(f"  {'raw environment limit (serial, random actions)':<48} {raw:>8,.0f} steps/s")
    for key, value in fps.items():
        print(f"  {names[key]:<48} {value:>8,.0f} FPS")
    print("ratios")
    print(f"  ours batched GRU / ours serial GRU: {fps['gru_batched'] / fps['gru']:.2f}x")
    print(f"  ours batched wide GRU / serial GRU: {fps['gru_wide'] / fps['gru']:.2f}x")
    if not args.skip_sb3:
        print(f"  ours MLP / SB3 PPO:                {fps['mlp'] / fps['sb3']:.2f}x")
        print(f"  ours batched wide MLP / SB3 PPO:   {fps['mlp_wide'] / fps['sb3']:.2f}x")
        print(f"  ours flattened-GRU / RecurrentPPO: {fps['flat_gru'] / fps['sb3_rec']:.2f}x")
        if not args.skip_async:
            mlp_ratio = fps["mlp_async"] / fps["sb3"]
            print(f"  ours MLP async / SB3 PPO:                {mlp_ratio:.2f}x")
            print(
                "  ours flattened-GRU async / RecurrentPPO: "
                f"{fps['flat_gru_async'] / fps['sb3_rec']:.2f}x"
            )


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
