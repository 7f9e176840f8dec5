"""The one process runtime (rl/utils/processes.py) on its own: calls, faults, hangs, the end.

The multiprocess sampler, process collection workers and validation each have their own fault
tests (tests/test_multiprocess_sampler.py, tests/test_faults_collection.py,
tests/test_validation.py); these drive :class:`ChildProcesses` directly with a small served
object, as an attacker of its guarantees would: a child that raises, dies mid-call, hangs,
ignores SIGTERM, or outlives its fork server.
"""

from __future__ import annotations

import logging
import multiprocessing.forkserver as mp_forkserver
import os
import signal
import threading
import time

import psutil
import pytest
import torch

from rl.utils.processes import ChildFailed, ChildProcesses


class Echo:
    """A served object: a few methods that misbehave on request."""

    def __init__(self, *, tag: str, fail_build: bool = False) -> None:
        if fail_build:
            raise ValueError(f"cannot build {tag}")
        self.tag = tag
        self.calls: list[str] = []
        self.stop = threading.Event()
        self.where: str | None = None

    def hello(self, x: int) -> tuple[str, int, int]:
        self.calls.append("hello")
        return self.tag, x, os.getpid()

    def order(self) -> list[str]:
        return list(self.calls)

    def tensor(self, n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32)

    def boom(self, where: str) -> None:
        self.where = where
        raise RuntimeError(f"boom at {where}")

    def failure_site(self) -> tuple[str | None, int | None]:
        return (f"part {self.where}", 7) if self.where else (None, None)

    def die(self, code: int) -> None:
        os._exit(code)

    def sleep(self, seconds: float) -> str:
        self.calls.append("sleep")
        self.stop.wait(seconds)
        return "slept"

    def interrupt(self) -> str:  # a control call: runs beside sleep
        self.stop.set()
        return "interrupted"

    def unpicklable(self) -> object:
        return threading.Lock()


def children(name: str = "echo", n: int = 2, **options: object) -> ChildProcesses:
    return ChildProcesses(Echo, [{"tag": f"t{i}"} for i in range(n)], name=name, **options)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_calls_run_in_order_and_results_come_back_by_value() -> None:
    kids = children()
    try:
        calls = [kids.call(i % 2, "hello", i) for i in range(6)]
        results = kids.gather(calls, 10.0, "answering")
        assert [(tag, x) for tag, x, _ in results] == [(f"t{i % 2}", i) for i in range(6)]
        assert {pid for _, _, pid in results} == set(kids.pids)
        assert kids.result(kids.call(0, "order")) == ["hello"] * 3
        tensor = kids.result(kids.call(1, "tensor", 5))
        assert torch.equal(tensor, torch.arange(5, dtype=torch.float32))
    finally:
        kids.close()
    assert wait_gone(kids.pids) == []


def test_a_call_that_raises_names_the_child_the_site_and_the_traceback() -> None:
    kids = children()
    try:
        with pytest.raises(ChildFailed) as err:
            kids.result(kids.call(1, "boom", "x"), what="testing")
        e = err.value
        assert e.child == 1 and e.site == "part x" and e.site_index == 7
        assert str(e).startswith(f"echo 1 (pid {kids.pids[1]}): part x raised while testing")
        assert "RuntimeError: boom at x" in str(e) and e.traceback is not None
        # the child serves on: the parent decides what a failure ends
        assert kids.result(kids.call(1, "hello", 3))[:2] == ("t1", 3)
        with pytest.raises(ChildFailed, match="cannot pickle"):
            kids.result(kids.call(0, "unpicklable"))
    finally:
        kids.close()


def test_gather_ends_every_child_on_a_failure() -> None:
    kids = children()
    pids = list(kids.pids)
    with pytest.raises(ChildFailed, match=r"echo 0 .*part y raised while stepping"):
        kids.gather([kids.call(0, "boom", "y"), kids.call(1, "sleep", 30.0)], 60.0, "stepping")
    assert wait_gone(pids) == []  # the sleeping one too, not after its 30 s


def test_a_build_failure_is_named_with_its_traceback() -> None:
    with pytest.raises(ChildFailed) as err:
        ChildProcesses(Echo, [{"tag": "a"}, {"tag": "b", "fail_build": True}], name="echo")
    assert "echo 1 (pid " in str(err.value) and "failed while starting" in str(err.value)
    assert "ValueError: cannot build b" in str(err.value)


@pytest.mark.parametrize(("how", "reason"), [("exit", "exited with code 3"),
                                             ("kill", "died with SIGKILL")])  # fmt: skip
def test_a_dead_child_is_noticed_at_once(how: str, reason: str) -> None:
    kids = children()
    try:
        slow = kids.call(1, "sleep", 60.0)
        start = time.monotonic()
        if how == "exit":
            kids.call(0, "die", 3)
            call = kids.call(0, "hello", 1)  # queued behind the death: its result is the death
        else:
            os.kill(kids.pids[0], signal.SIGKILL)
            call = kids.call(0, "hello", 1)
        with pytest.raises(ChildFailed, match=rf"echo 0 \(pid \d+\) {reason} while answering"):
            kids.result(call)
        assert time.monotonic() - start < 10
        assert not kids.done(slow)  # the other child is untouched
    finally:
        kids.close(grace=0.5)
    assert wait_gone(kids.pids) == []


def test_a_hung_child_is_named_in_a_warning_then_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    kids = children(timeout_key="my.timeout")
    pids = list(kids.pids)
    start = time.monotonic()
    with pytest.raises(ChildFailed) as err:
        kids.gather([kids.call(0, "hello", 1), kids.call(1, "sleep", 60.0)], 1.0, "napping")
    waited = time.monotonic() - start
    assert str(err.value) == (
        f"no reply within 1.0 s while napping from echo 1 (pid {pids[1]}) (hung? my.timeout)"
    )
    assert 1.0 <= waited < 10
    (warning,) = [r for r in caplog.records if "no reply for" in r.message]
    assert f"echo 1 (pid {pids[1]})" in warning.message and "my.timeout" in warning.message
    assert wait_gone(pids) == []


def test_control_calls_are_served_beside_the_call_in_progress() -> None:
    kids = children(n=1, control={"interrupt"})
    try:
        slow = kids.call(0, "sleep", 60.0)
        time.sleep(0.2)
        assert kids.result(kids.call(0, "interrupt")) == "interrupted"
        assert kids.result(slow) == "slept"
    finally:
        kids.close()


def test_a_child_that_ignores_sigterm_and_hangs_is_killed_by_close() -> None:
    kids = children(n=1, ignored_signals=(signal.SIGINT, signal.SIGTERM))
    pid = kids.pids[0]
    kids.call(0, "sleep", 120.0)
    start = time.monotonic()
    kids.close(grace=0.5)
    assert time.monotonic() - start < 10
    assert wait_gone([pid]) == []
    with pytest.raises(RuntimeError, match="closed"):
        kids.call(0, "hello", 1)


def test_the_fork_servers_end_is_not_a_childs_death() -> None:
    """A SIGTERM to the process group ends the fork server at once; its children live on.

    ``multiprocessing`` reads a forkserver child's exit code from a pipe of the server, so the
    child looked dead (code 255) as soon as the server ended: a run stopped by SIGTERM lost its
    checkpoint to a "dead" collection worker that was alive and well.
    """
    kids = children(n=1, ignored_signals=(signal.SIGINT, signal.SIGTERM))
    try:
        server = mp_forkserver._forkserver._forkserver_pid
        assert server is not None and alive(server)
        busy = kids.call(0, "sleep", 2.0)  # a rollout in flight when the signal comes
        os.kill(server, signal.SIGTERM)
        assert wait_gone([server]) == []
        assert kids.result(busy) == "slept"
        assert kids.result(kids.call(0, "hello", 5))[:2] == ("t0", 5)
        assert alive(kids.pids[0])
    finally:
        kids.close()
    assert wait_gone(kids.pids) == []


def test_garbage_collection_ends_the_children() -> None:
    kids = children()
    pids = list(kids.pids)
    del kids
    import gc

    gc.collect()
    assert wait_gone(pids) == []
