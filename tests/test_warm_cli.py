"""The suite's warm command lines (tests/warm_cli.py): a fork of the warm interpreter behaves as a
fresh ``python script.py`` does, each case compared with a real start of the same script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import warm_cli

REPORT = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "var": os.environ.get("WARM_TEST_VAR"),
    "path0": sys.path[0], "name": __name__, "file": __file__,
    "fds": sorted(int(f) for f in os.listdir("/proc/self/fd"))[:3],
    "more_fds": len(os.listdir("/proc/self/fd")) > 4,
    "stdin": sys.stdin.readline().strip(), "line_buffered": sys.stdout.line_buffering,
    "ppid": os.getppid(), "sid": os.getsid(0) == os.getpid(),
}))
"""


# A thread still running when the script ends: joined (its output printed) before the exit.
JOINED = "import threading as t, time; t.Thread(target=lambda: (time.sleep(.3), print(1))).start()"


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``script(body)``: a script file served warm (as train.py is) and its path."""

    def make(body: str) -> Path:
        path = tmp_path / f"script_{len(list(tmp_path.glob('script_*')))}.py"
        path.write_text(textwrap.dedent(body))
        monkeypatch.setattr(warm_cli, "SCRIPTS", {*warm_cli.SCRIPTS, path.resolve()})
        return path

    return make


def both(
    args: list[str], **kwargs
) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The command run warm, then cold (a real interpreter)."""
    warm = subprocess.run(args, capture_output=True, text=True, timeout=120, **kwargs)
    with warm_cli.cold():
        cold = subprocess.run(args, capture_output=True, text=True, timeout=120, **kwargs)
    return warm, cold


def test_a_warm_child_sees_what_a_fresh_start_sees(script, tmp_path: Path) -> None:
    path = script(REPORT)
    env = {**os.environ, "WARM_TEST_VAR": "42"}
    warm, cold = both(
        [sys.executable, str(path), "a b", "--x=1"], cwd=tmp_path, env=env, input="line\n",
        start_new_session=True,
    )  # fmt: skip
    assert warm.returncode == cold.returncode == 0, (warm.stderr, cold.stderr)
    seen_warm, seen_cold = json.loads(warm.stdout), json.loads(cold.stdout)
    assert seen_warm.pop("ppid") == warm_cli.server_pid()  # forked, not started
    assert seen_cold.pop("ppid") == os.getpid()
    assert seen_warm == seen_cold
    assert seen_warm["argv"] == [str(path), "a b", "--x=1"] and seen_warm["var"] == "42"
    assert seen_warm["stdin"] == "line" and seen_warm["sid"] and not seen_warm["more_fds"]


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        ("pass", 0, None),
        ("raise SystemExit(3)", 3, None),
        ("import sys; sys.exit('bye')", 1, "bye"),
        ("raise ValueError('boom')", 1, "ValueError: boom"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM, None),
        ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
        ("import atexit; atexit.register(print, 'at exit'); print('no newline', end='')", 0, None),
        (JOINED, 0, None),
    ],
)  # fmt: skip
def test_a_warm_child_ends_as_a_fresh_start_ends(script, body: str, code: int, says) -> None:
    path = script(body)
    warm, cold = both([sys.executable, str(path)])
    assert warm.returncode == cold.returncode == code, (warm.stderr, cold.stderr)
    assert warm.stdout == cold.stdout
    if says is not None:
        assert says in warm.stderr and says in cold.stderr
    assert warm.stderr == cold.stderr


def test_waits_time_out_and_signals_reach_the_child(script) -> None:
    path = script("import time; print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    assert isinstance(proc, warm_cli.WarmPopen) and proc._warm is not None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    proc.stdout.close()


def test_a_poll_loop_sees_the_child_end(script) -> None:
    """``poll()`` alone (no ``wait``) reads the exit: a loop of polls, as tests/test_bench.py
    watches its runs, ends when the child does."""
    path = script("import sys; sys.exit(3)")
    proc = subprocess.Popen([sys.executable, str(path)])
    assert isinstance(proc, warm_cli.WarmPopen) and proc._warm is not None
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.returncode == 3


def test_start_up_settings_and_other_programs_start_real_interpreters(script) -> None:
    path = script("import os; print(os.getppid())")
    hashed = {**os.environ, "PYTHONHASHSEED": "123"}
    for args, env in (
        ([sys.executable, str(path)], hashed),
        ([sys.executable, "-u", str(path)], None),
        ([sys.executable, "-c", "import os; print(os.getppid())"], None),
    ):
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
        assert int(done.stdout) == os.getpid(), args
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert int(done.stdout) == warm_cli.server_pid()
    # What the warm interpreter's own imports set counts as unchanged: this process has it too
    # once it imports them (most of the suite's processes do).
    import torch._dynamo  # noqa: F401  (sets TORCHINDUCTOR_CACHE_DIR)

    assert "TORCHINDUCTOR_CACHE_DIR" in os.environ
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert int(done.stdout) == warm_cli.server_pid()
    moved = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=moved)
    assert int(done.stdout) == os.getpid()


def test_a_moved_environment_gets_a_warm_interpreter_of_its_own(
    script, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module the test process imported set a start-up variable (joblib: KMP_INIT_AT_FORK)."""
    path = script("import os; print(os.getppid(), os.environ.get('KMP_INIT_AT_FORK'))")
    subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    first = warm_cli.server_pid()
    monkeypatch.setenv("KMP_INIT_AT_FORK", "FALSE")
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    second = warm_cli.server_pid()
    assert second != first and done.stdout.split() == [str(second), "FALSE"]


@pytest.mark.cold_cli
def test_the_cold_cli_marker_starts_real_interpreters(script) -> None:
    path = script("import os; print(os.getppid())")
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert int(done.stdout) == os.getpid()


def test_children_still_running_end_with_the_test_process(script) -> None:
    path = script("import time; time.sleep(60)")
    client = warm_cli._Client()
    try:
        assert client.ready() is not None
        devnull = os.open(os.devnull, os.O_RDWR)
        request = {
            "argv": [sys.executable, str(path)],
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "start_new_session": False,
            "process_group": -1,
        }
        pid = client.spawn(request, [devnull] * 3)
        os.close(devnull)
        assert client.exit_code(pid, 0) is None
    finally:
        client.close()  # as when the test process exits: its end of the socket closes
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
