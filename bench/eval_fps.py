"""Evaluation's wall time: the serial sampler against the batched one (``sampler=batched``).

``ppo_nav``'s evaluation (200 episodes of the held-out ``test`` layouts of ``task=nav``,
seeds 1,000,000 + i, sampled actions, 16 environments: ``eval`` in conf/train.yaml and the
experiment) through :func:`rl.collection.episodes.evaluate_policy`, stepped by the serial
sampler (what every run evaluated with before) and by the batched one (what a run trained with
``sampler=batched`` evaluates with now: :class:`rl.collection.episodes.EvalSampler`), the
latter also with more environments (``eval.num_envs``). Two actors:

- ``policy``: a fresh ``nav_cnn_gru`` policy (seed 1) whose STOP logit is pushed down, so that
  every episode runs its 100 steps (truncated): the most a policy's evaluation costs;
- ``expert``: the task's expert (shortest paths, the length of a trained policy's episodes),
  no model: the environments' and the loop's own cost (``evaluate.py test_expert=true``).

Each row: the best wall time of ``--repeats`` (environments built, episodes run, closed),
episodes/s, the speed-up over the serial sampler at 16 environments, and how the per-episode
records compare with the serial sampler's at the same environment count: ``bitwise``, or
``return ~f32`` where only ``return`` differs, by float32 rounding (the batched PointNav gives
float32 rewards, which the sampler sums; the serial one sums the environments' float64).
Sampled actions are drawn for the batch at once, so other environment counts draw other actions.

``--device cuda``: the policy and the batched PointNav on the GPU (actions stay there); the
serial rows' policy on the GPU as well.

``--smoke``: 8 episodes, 4 and 8 environments, one repeat: to check that the benchmark runs
(``tests/test_bench.py``), not to measure.

    python bench/eval_fps.py [--episodes 200] [--envs 16 64 200] [--repeats 3] [--device cpu]
                             [--threads 1] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from rl.collection.episodes import (
    EvalResult,
    EvalSampler,
    episode_seed_list,
    evaluate_expert,
    evaluate_policy,
)
from rl.models.policy import Policy, build_policy
from rl.tasks.factory import task_layout, with_split
from rl.utils.seeding import set_seed
from rl_envs.pointnav.env import Actions

ROOT = Path(__file__).resolve().parents[1]
TASK = with_split(yaml.safe_load((ROOT / "conf/task/nav.yaml").read_text()), "test")
MODEL = yaml.safe_load((ROOT / "conf/model/nav_cnn_gru.yaml").read_text())
FIRST_SEED = 1_000_000


def never_stopping_policy(device: str) -> Policy:
    """A fresh ``nav_cnn_gru`` policy (seed 1) that all but never takes STOP."""
    set_seed(1)
    model = build_policy(MODEL, *task_layout(TASK).spaces)
    with torch.no_grad():
        model.actor_out.bias[int(Actions.STOP)] = -30.0  # type: ignore[index, union-attr]
    return model.to(device)


def compare(got: EvalResult, ref: EvalResult) -> str:
    """How ``got``'s per-episode records compare with ``ref``'s."""
    if got.episodes == ref.episodes:
        return "bitwise"
    rest = [
        [{k: v for k, v in e.items() if k != "return"} for e in r.episodes] for r in (got, ref)
    ]
    close = all(
        abs(a["return"] - b["return"]) <= 1e-6 * max(1.0, abs(b["return"]))
        for a, b in zip(got.episodes, ref.episodes, strict=True)
    )
    return "return ~f32" if rest[0] == rest[1] and close else "differ"


def timed(run: Callable[[], EvalResult], repeats: int) -> tuple[float, EvalResult]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--envs", type=int, nargs="+", default=[16, 64, 200])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.envs, args.repeats = 8, [4, 8], 1
    torch.set_num_threads(args.threads)
    seeds = episode_seed_list(args.episodes, FIRST_SEED)
    batched = EvalSampler(batched=True, device=args.device)
    model = never_stopping_policy(args.device)

    def policy(sampler: EvalSampler | None, envs: int) -> Callable[[], EvalResult]:
        return lambda: evaluate_policy(
            model=model, task=TASK, episode_seeds=seeds, num_envs=envs,
            device=args.device, sampler=sampler,
        )  # fmt: skip

    def expert(sampler: EvalSampler | None, envs: int) -> Callable[[], EvalResult]:
        return lambda: evaluate_expert(
            task=TASK, episode_seeds=seeds, num_envs=envs, sampler=sampler
        )

    base = args.envs[0]
    print(
        f"evaluation of {args.episodes} episodes of task=nav (test split), {args.threads} torch "
        f"thread(s), device {args.device}, best of {args.repeats}"
    )
    header = f"  {'actor':<7} {'sampler':<8} {'envs':>5} {'seconds':>9} {'episodes/s':>11}"
    print(header + f" {'speed-up':>9}  vs serial (same envs)")
    actors: dict[str, Callable[[EvalSampler | None, int], Callable[[], EvalResult]]] = {
        "policy": policy,
        "expert": expert,
    }
    for name, make in actors.items():
        serial: dict[int, EvalResult] = {}
        ref_seconds = 0.0
        rows: list[tuple[str, EvalSampler | None, int]] = [("serial", None, base)]
        rows += [("batched", batched, n) for n in args.envs]
        for kind, sampler, envs in rows:
            seconds, result = timed(make(sampler, envs), args.repeats)
            if sampler is None:
                serial[envs], ref_seconds = result, seconds
                same = "-"
            elif envs not in serial:
                serial[envs] = make(None, envs)()
                same = compare(result, serial[envs])
            else:
                same = compare(result, serial[envs])
            mean_length = sum(e["length"] for e in result.episodes) / len(result.episodes)
            rate = args.episodes / seconds
            print(
                f"  {name:<7} {kind:<8} {envs:>5} {seconds:>9.3f} {rate:>11,.1f}"
                f" {ref_seconds / seconds:>8.1f}x  {same} (mean length {mean_length:.1f})"
            )


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
