"""The device path on a GPU: pinned staging, where the policy acts, the compiled update.

Two measurements, both with ``bench/train_fps.py``'s settings (``rl/PointNav-v0``, 16
environments stepped serially on the CPU, 128-step rollouts, 4 epochs x 4 minibatches, one
torch thread):

(a) **One step's copies** (CUDA only), microseconds per step over ``--micro-steps`` steps: a
    ``ppo_nav`` step's tensors (the 7x7x3 view, the goal, rewards, both flags, the expert's
    actions) to the GPU, a small kernel on them, the actions (16 int64) back, either each
    tensor by itself from pageable memory (``Tensor.to(non_blocking=True)``, then
    ``Tensor.cpu()``: the path before pinned staging) or through
    :class:`~rl.utils.staging.PinnedTransfers` (one packed, pinned, non-blocking copy each way).
(b) **Training FPS** (env steps/s over the last three quarters of ``--steps``, as
    ``train_fps.py``; ``wall`` is the whole run, start-up and any compile time included) of
    the CNN + GRU policy (``ppo_nav``'s ``nav_cnn_gru``) and the memoryless MLP:

    - ``cpu``: learner and inference on the CPU;
    - ``cuda``: learner on the GPU, the policy acting there with pinned staging (the default);
    - ``cuda, unstaged``: the same with every tensor copied by itself (the path before);
    - ``cuda, inference cpu``: ``collector.inference_device=cpu`` (a CPU copy of the policy
      acts, its weights taken before every rollout; the rollout handed over in one copy);
    - ``cuda, compile``: ``pipeline.compile=true`` (``reduce-overhead``: CUDA graphs);
    - ``cpu, compile``: ``pipeline.compile=true`` on the CPU (Inductor's default mode).

Without CUDA the CUDA rows print ``n/a (no CUDA)``. ``--smoke`` (``tests/test_bench.py``): a
few hundred env steps per row and no compile rows (``tests/test_device_path.py`` compiles),
to check that the script runs, not to measure. ``--skip-compile`` leaves the compile rows out.

    python bench/device_path.py [--steps 20480] [--micro-steps 2000] [--skip-compile] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_fps  # noqa: E402  (the same runs and settings)

NUM_ENVS = train_fps.NUM_ENVS
MODELS = {"gru": "nav_cnn_gru", "mlp": "mlp"}
NA = "n/a (no CUDA)"


def ppo_nav_step(num_envs: int) -> dict[Any, torch.Tensor]:
    """A ``ppo_nav`` step's tensors as the serial sampler returns them (fresh host memory)."""
    return {
        ("obs", "view"): torch.randint(0, 11, (num_envs, 7, 7, 3), dtype=torch.uint8),
        ("obs", "goal"): torch.randn(num_envs, 2),
        "expert_actions": torch.randint(0, 3, (num_envs,)),
        "rewards": torch.randn(num_envs),
        "terminated": torch.zeros(num_envs, dtype=torch.bool),
        "truncated": torch.zeros(num_envs, dtype=torch.bool),
    }


def copies_us(staged: bool, steps: int) -> float:
    """Microseconds per step: a step's tensors to the GPU, a kernel, the actions back."""
    from rl.utils.staging import PinnedTransfers

    device = torch.device("cuda")
    transfers = PinnedTransfers(device)
    steps_data = [ppo_nav_step(NUM_ENVS) for _ in range(8)]  # (fresh-looking host memory)

    def one(step: dict[Any, torch.Tensor]) -> None:
        if staged:
            moved = transfers.to_device(step)
        else:
            moved = {k: v.to(device, non_blocking=True) for k, v in step.items()}
        actions = (moved["obs", "view"].sum((1, 2, 3)) + moved["expert_actions"]) % 3
        host = transfers.to_host(actions) if staged else actions.cpu()
        host.numpy()

    for i in range(100):  # warm-up: allocations, the caching allocator, lazy CUDA init
        one(steps_data[i % 8])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(steps):
        one(steps_data[i % 8])
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e6


@contextlib.contextmanager
def unstaged() -> Iterator[None]:
    """Collection without pinned staging: every tensor copied by itself (the path before)."""
    import rl.collection.local as local

    saved = local.pinned_transfers
    local.pinned_transfers = lambda device: None  # type: ignore[assignment]
    try:
        yield
    finally:
        local.pinned_transfers = saved


def training(model: str, steps: int, overrides: list[str]) -> tuple[float, float]:
    """``(FPS over the last three quarters, wall seconds of the whole run)``."""
    start = time.perf_counter()
    fps = train_fps.ours(model, steps, overrides)
    return float(fps), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=NUM_ENVS * train_fps.NUM_STEPS * 10)
    parser.add_argument("--micro-steps", type=int, default=2000)
    parser.add_argument("--skip-compile", action="store_true", help="leave the compile rows out")
    parser.add_argument("--smoke", action="store_true", help="tiny budgets: check it runs")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(steps=NUM_ENVS * train_fps.SMOKE_NUM_STEPS * 2, micro_steps=50)
        args = parser.parse_args()
        args.skip_compile = True
        train_fps.use_smoke_rollouts()
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else "no CUDA"
    print(f"device: {device}; torch {torch.__version__}", flush=True)

    print(f"\n(a) one step's copies, {NUM_ENVS} envs (ppo_nav's step), us per step")
    for label, staged in (("each tensor by itself (pageable)", False), ("pinned staging", True)):
        value = f"{copies_us(staged, args.micro_steps):>8.1f} us" if cuda else NA
        print(f"  {label:<44} {value}", flush=True)

    plain = contextlib.nullcontext
    rows: list[tuple[str, list[str], bool, Callable[[], Any]]] = [
        ("cpu", ["device=cpu"], False, plain),
        ("cuda", ["device=cuda"], True, plain),
        ("cuda, unstaged", ["device=cuda"], True, unstaged),
        ("cuda, inference cpu", ["device=cuda", "collector.inference_device=cpu"], True, plain),
    ]
    if not args.skip_compile:
        rows += [
            ("cuda, compile", ["device=cuda", "pipeline.compile=true"], True, plain),
            ("cpu, compile", ["device=cpu", "pipeline.compile=true"], False, plain),
        ]
    print(
        f"\n(b) training FPS on rl/PointNav-v0, {args.steps:,} env steps each ({NUM_ENVS} envs x "
        f"{train_fps.NUM_STEPS} steps, {train_fps.EPOCHS} epochs x {train_fps.MINIBATCHES} "
        "minibatches, 1 torch thread)"
    )
    for key, model in MODELS.items():
        for label, overrides, needs_cuda, context in rows:
            name = f"{key} {label}"
            if needs_cuda and not cuda:
                print(f"  {name:<44} {NA}", flush=True)
                continue
            with context():
                fps, wall = training(model, args.steps, overrides)
            print(f"  {name:<44} {fps:>8,.0f} FPS   (wall {wall:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without a last garbage collection of the imports (torch): ~1 s
