"""The multiprocess sampler: bitwise parity with the serial one, exact evaluation lists, faults."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from small import assert_same_step, small_nav

from rl.sampling import (
    MultiprocessSampler,
    SamplerProcessError,
    SerialSampler,
    build_sampler,
    finished_episodes,
)
from rl.utils.seeding import env_seeds

ROOT = Path(__file__).resolve().parents[1]
SMALL = small_nav(max_steps=12)
CARTPOLE = {"_target_": "rl.tasks.make_gym_env", "env_id": "CartPole-v1"}
FAULTY = {"_target_": "rl_envs.toys.debug.FaultyEnv"}


_ALREADY_RUNNING: set[int] = set()


@pytest.fixture(autouse=True)
def _processes_from_before() -> None:
    """Descendants that existed before the test (e.g. a shared Ray instance) are not its own."""
    _ALREADY_RUNNING.clear()
    _ALREADY_RUNNING.update(p.pid for p in psutil.Process().children(recursive=True))


def live_children() -> list[psutil.Process]:
    """Live descendants this test started, except multiprocessing's forkserver and tracker.

    Those two are started once per interpreter by the standard library and exit with it.
    """
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.pid in _ALREADY_RUNNING or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if any("forkserver" in p or "resource_tracker" in p for p in proc.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(proc)
    return out


def assert_no_children(timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while live_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_children() == []


@pytest.mark.parametrize(
    ("task", "processes", "envs", "steps"),
    [
        (SMALL, 1, 3, 60),
        (SMALL, 2, 4, 60),
        (SMALL, 2, 5, 60),  # uneven: 3 + 2
        (SMALL, 3, 7, 60),  # uneven: 3 + 2 + 2
        (CARTPOLE, 2, 3, 150),
    ],
)
def test_bitwise_identical_to_serial(task: dict, processes: int, envs: int, steps: int) -> None:
    rng = np.random.default_rng(processes * 100 + envs)
    num_actions = 4 if task is SMALL else 2
    with (
        SerialSampler(task=task, num_envs=envs, seed=5) as serial,
        MultiprocessSampler(task=task, num_processes=processes, num_envs=envs, seed=5) as multi,
    ):
        assert multi.num_envs == envs and multi.num_processes == processes
        assert multi.observation_space == serial.observation_space
        assert multi.action_space == serial.action_space
        assert multi.step_fields == serial.step_fields
        assert_same_step(serial.reset(), multi.reset())
        truncations = episodes = 0
        for t in range(steps):
            if t == steps // 2:  # forced new episodes (advance_scene_rollout_period) match too
                assert_same_step(serial.new_episodes(), multi.new_episodes())
            actions = rng.integers(0, num_actions, envs)
            a, b = serial.step(actions), multi.step(actions)
            assert_same_step(a, b)
            truncations += int(a["truncated"].sum())
            episodes += len(finished_episodes(a))
        assert episodes > 0
        if task is SMALL:
            assert truncations > 0  # the final-observation path is exercised


def test_halves_with_env_offset_match_one_serial_sampler() -> None:
    """Two samplers over halves of one seed stream (double buffering) = one serial sampler."""
    rng = np.random.default_rng(0)
    with (
        SerialSampler(task=SMALL, num_envs=6, seed=2) as serial,
        MultiprocessSampler(task=SMALL, num_processes=1, num_envs=3, seed=2, total_envs=6) as a,
        MultiprocessSampler(
            task=SMALL, num_processes=2, num_envs=3, seed=2, env_offset=3, total_envs=6
        ) as b,
    ):
        obs = serial.reset()["obs"]
        obs_a, obs_b = a.reset()["obs"], b.reset()["obs"]
        assert obs.keys() == obs_a.keys() == obs_b.keys()
        assert all(torch.equal(obs[k], torch.cat([obs_a[k], obs_b[k]])) for k in obs.keys())
        for _ in range(40):
            actions = rng.integers(0, 4, 6)
            a.step_async(actions[:3])
            b.step_async(actions[3:])
            x, ya, yb = serial.step(actions), a.step_wait(), b.step_wait()
            assert torch.equal(x["rewards"], torch.cat([ya["rewards"], yb["rewards"]]))
            assert x["obs"].keys() == ya["obs"].keys() == yb["obs"].keys()
            assert all(
                torch.equal(x["obs", k], torch.cat([ya["obs", k], yb["obs", k]]))
                for k in x["obs"].keys()
            )
            assert finished_episodes(x) == finished_episodes(ya) + finished_episodes(yb)


def test_state_dict_round_trips_between_layouts_and_serial() -> None:
    """Episodes in flight saved by one layout resume bitwise in another (and in serial)."""
    rng = np.random.default_rng(1)
    actions = rng.integers(0, 4, size=(30, 5))
    with MultiprocessSampler(task=SMALL, num_processes=2, num_envs=5, seed=4) as a:
        a.reset()
        for t in range(10):
            a.step(actions[t])
        state = a.state_dict()
        expected = [a.step(actions[t]) for t in range(10, 30)]
    with SerialSampler(task=SMALL, num_envs=5, seed=4) as ref:
        ref.reset()
        for t in range(10):
            ref.step(actions[t])
        assert ref.state_dict() == state  # the same format as the serial sampler's
    for resumed in (
        MultiprocessSampler(task=SMALL, num_processes=3, num_envs=5, seed=4),
        SerialSampler(task=SMALL, num_envs=5, seed=4),
    ):
        with resumed:
            resumed.load_state_dict(state)
            for t in range(10, 30):
                assert_same_step(resumed.step(actions[t]), expected[t - 10])


def test_envs_per_process_and_num_envs_precedence() -> None:
    with MultiprocessSampler(task=SMALL, num_processes=2, envs_per_process=3, seed=0) as s:
        assert s.num_envs == 6 and s.process_envs == [(0, 3), (3, 6)]
    with MultiprocessSampler(task=SMALL, num_processes=3, envs_per_process=8, num_envs=4) as s:
        assert s.num_envs == 4 and s.process_envs == [(0, 2), (2, 3), (3, 4)]
    with MultiprocessSampler(task=SMALL, num_processes=4, num_envs=2) as s:
        assert s.num_processes == 2


def run_episode_list(sampler: SerialSampler | MultiprocessSampler) -> list:
    expert = sampler.reset()["expert_actions"].numpy()
    episodes = []
    while sampler.num_active:
        actions = expert.copy()
        actions[::3] = 0  # deterministic, not the pure expert: some episodes are truncated
        batch = sampler.step(actions)
        episodes += finished_episodes(batch)
        expert = batch["expert_actions"][~batch["paused"]].numpy()
    return episodes


@pytest.mark.parametrize(("processes", "envs"), [(1, 1), (2, 3), (2, 4), (3, 7), (2, 16)])
def test_evaluation_runs_every_episode_exactly_once(processes: int, envs: int) -> None:
    seeds = list(range(100, 113))  # 13 episodes: uneven over 3, 4 and 7; fewer than 16
    with MultiprocessSampler(
        task=SMALL, num_processes=processes, num_envs=envs, episode_seeds=seeds
    ) as multi:
        got = run_episode_list(multi)
        assert multi.num_active == 0
        assert run_episode_list(multi) == got  # reset() starts the list again
    assert sorted(e.episode_seed for e in got) == seeds
    with SerialSampler(task=SMALL, num_envs=envs, episode_seeds=seeds) as serial:
        assert got == run_episode_list(serial)  # same order, env indices and metrics


def test_build_sampler_makes_either_kind() -> None:
    cfg = {
        "_target_": "rl.sampling.MultiprocessSampler",
        "_partial_": True,
        "num_processes": 2,
        "envs_per_process": 8,
        "mp_start_method": "forkserver",
    }
    seeds = list(range(9))
    with build_sampler(cfg, task=SMALL, episode_seeds=seeds, num_envs=4) as multi:
        assert isinstance(multi, MultiprocessSampler) and multi.num_envs == 4
        got = run_episode_list(multi)
    with build_sampler(None, task=SMALL, episode_seeds=seeds, num_envs=4) as serial:
        assert isinstance(serial, SerialSampler)
        assert got == run_episode_list(serial)


def test_spawn_start_method_works() -> None:
    with MultiprocessSampler(
        task=CARTPOLE, num_processes=1, num_envs=2, mp_start_method="spawn", seed=1
    ) as multi:
        assert multi.start_method == "spawn"
        assert multi.reset()["obs", "obs"].shape == (2, 4)
    assert_no_children()


# ---------------------------------------------------------------------------------- faults
def faulty(num_envs: int, env_index: int, **kwargs: object) -> dict:
    """A FaultyEnv task whose environment ``env_index`` fails (seed 0 stream)."""
    return {**FAULTY, "fail_seed": env_seeds(num_envs, 0)[env_index], **kwargs}


def step_until_error(sampler: MultiprocessSampler, steps: int = 20) -> None:
    sampler.reset()
    for _ in range(steps):
        sampler.step(np.zeros(sampler.num_active, dtype=np.int64))


def test_raising_env_names_worker_env_and_traceback() -> None:
    task = faulty(5, 3, fail_at_step=4)
    sampler = MultiprocessSampler(task=task, num_processes=2, num_envs=5, seed=0)
    pids = sampler.process_pids
    start = time.monotonic()
    with pytest.raises(SamplerProcessError) as info:
        step_until_error(sampler)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "sampler process 1" in message and "environment 3 raised" in message
    assert "Traceback (most recent call last)" in message
    assert "ValueError: FaultyEnv failed on purpose at step 4" in message
    assert "rl_envs/toys/debug.py" in message
    assert info.value.process_index == 1 and info.value.env_index == 3
    assert not any(psutil.pid_exists(p) and _alive(p) for p in pids)
    assert_no_children()
    sampler.close()  # idempotent after a failure


def test_raising_on_reset_is_reported() -> None:
    task = faulty(4, 0, fail_on_reset=True)
    with MultiprocessSampler(task=task, num_processes=2, num_envs=4, seed=0) as sampler:
        with pytest.raises(SamplerProcessError, match=r"process 0 .*environment 0 raised while"):
            sampler.reset()
    assert_no_children()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_killed_worker_is_detected_quickly() -> None:
    sampler = MultiprocessSampler(task=SMALL, num_processes=3, num_envs=6, seed=0)
    sampler.reset()
    pids = sampler.process_pids
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(SamplerProcessError, match=r"process 1 .*died with SIGKILL while stepping"):
        for _ in range(100):
            sampler.step(np.zeros(6, dtype=np.int64))
    assert time.monotonic() - start < 10
    assert not any(_alive(p) for p in pids)
    assert_no_children()


@pytest.mark.parametrize(("mode", "reason"), [("segfault", "SIGSEGV"), ("exit", "code 3")])
def test_worker_crash_inside_env_step(mode: str, reason: str) -> None:
    task = faulty(4, 2, fail_at_step=3, mode=mode)
    start = time.monotonic()
    with MultiprocessSampler(task=task, num_processes=2, num_envs=4, seed=0) as sampler:
        with pytest.raises(SamplerProcessError, match=rf"process 1 .*{reason}"):
            step_until_error(sampler)
    assert time.monotonic() - start < 10
    assert_no_children()


def test_hung_worker_times_out() -> None:
    task = faulty(2, 1, fail_at_step=2, mode="hang")
    start = time.monotonic()
    with MultiprocessSampler(task=task, num_processes=2, num_envs=2, seed=0, timeout=1.0) as s:
        with pytest.raises(SamplerProcessError, match=r"no reply within 1.0 s while stepping"):
            step_until_error(s)
    assert time.monotonic() - start < 10
    assert_no_children()


def test_close_and_garbage_collection_end_every_worker() -> None:
    sampler = MultiprocessSampler(task=SMALL, num_processes=2, num_envs=4, seed=0)
    pids = sampler.process_pids
    assert all(_alive(p) for p in pids)
    sampler.close()
    sampler.close()
    assert not any(_alive(p) for p in pids)
    with pytest.raises(RuntimeError, match="closed"):
        sampler.reset()
    sampler = MultiprocessSampler(task=SMALL, num_processes=2, num_envs=4, seed=0)
    pids = sampler.process_pids
    del sampler
    gc.collect()
    assert not any(_alive(p) for p in pids)
    assert_no_children()


def test_interrupted_main_process_leaves_no_worker(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) in a script using the sampler: the processes end with it."""
    script = tmp_path / "loop.py"
    script.write_text(
        "import faulthandler, signal\n"
        "import numpy as np\n"
        "from rl.sampling import MultiprocessSampler\n"
        f"TASK = {SMALL!r}\n"
        "if __name__ == '__main__':\n"
        # Ctrl-C as in a terminal: a test run started in the background (a shell without job
        # control) passes SIGINT on ignored, and Python then installs no KeyboardInterrupt.
        "    signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "    faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
        "    s = MultiprocessSampler(task=TASK, num_processes=2, num_envs=4)\n"
        "    s.reset()\n"
        "    print(*s.process_pids, flush=True)\n"
        "    while True:\n"
        "        s.step(np.zeros(4, dtype=np.int64))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # every thread's stack to stderr, then the report
            time.sleep(1.0)
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"no exit 20 s after SIGINT; its threads:\n{err.decode()[-6000:]}")
    finally:
        proc.kill()
    assert proc.returncode != 0
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


# ------------------------------------------------------------------------------ training
def test_training_smoke_run_with_multiprocess_sampler(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "+experiment=ppo_nav",
            "+debug=smoke",
            "sampler=multiprocess",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        env={**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    resolved = (run_dir / "config.yaml").read_text()
    assert "rl.sampling.MultiprocessSampler" in resolved
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt_*.pt"))[-1] == (
        "ckpt_stage00_step000000000256.pt"
    )
    assert (run_dir / "metrics.jsonl").read_text().count("charts/SPS") >= 4


def test_the_old_error_name_warns_and_is_the_new_class() -> None:
    import rl.sampling

    with pytest.warns(DeprecationWarning, match=r"now rl\.sampling\.SamplerProcessError"):
        assert rl.sampling.SamplerWorkerError is SamplerProcessError
