"""Warm interpreters for the suite's command lines: ``python train.py ...`` forked, not started.

A fresh ``train.py`` or ``evaluate.py`` spends 3-5 CPU-s before the first line of its run: the
interpreter, torch, Hydra, the engine and ``torch._dynamo`` (which every ``torch.optim``
optimizer imports). The suite starts about a hundred of them. So each test process keeps one
warm interpreter (:func:`serve`: those modules imported, nothing run), and while
:func:`install` is in effect a ``subprocess.Popen`` of ``[sys.executable, train.py or
evaluate.py or bench/<script>.py, *args]`` forks that interpreter instead of starting one
(``subprocess.run`` and ``check_output`` go through ``Popen``).

The forked child is what a fresh ``python train.py`` is in everything a test looks at:

- its own pid, in its own session or process group when asked (``start_new_session``,
  ``process_group``); signals reach it as they would;
- standard input, output and error are the descriptors ``Popen`` made (pipes, files,
  ``DEVNULL``, ``stderr=STDOUT``) or else the test process's own, as inherited; no other
  descriptor is open;
- argv, working directory and environment are the call's; ``sys.path[0]`` is the script's
  folder; the script runs as ``__main__`` (:func:`runpy.run_path`);
- it ends as CPython ends: its threads joined, ``atexit`` handlers run, output flushed; the exit
  code of ``SystemExit``, 1 after an uncaught exception (printed), killed by ``SIGINT`` after
  an uncaught ``KeyboardInterrupt``;
- its exit status becomes ``returncode`` (``-N``: killed by signal ``N``), so ``wait``,
  ``poll``, ``communicate``, ``send_signal`` and timeouts behave as they do.

What differs is what happened before the call: the modules are already imported, and children
share the warm interpreter's hash seed (``random``'s generator, NumPy's global one and
multiprocessing's authentication key are drawn afresh in each). So a call starts a real
interpreter where that could show:

- its environment differs from the warm interpreter's in a variable read at start-up or import
  (``PYTHON*`` but ``PYTHONUNBUFFERED``, ``OMP_*``, ``MKL_*``, ``LD_*``, ``CUDA_*``, ...),
  unless the warm interpreter's own imports set it so; where the test process's own
  environment has moved (a module it imported set one), a new warm interpreter starts in it;
- it uses ``shell``, ``preexec_fn``, ``pass_fds``, ``close_fds=False``, a user, group or
  umask, an interpreter option or another program;
- inside :func:`cold` (a test marked ``cold_cli``: one that checks what a start imports), or
  with ``RL_TEST_COLD_CLI=1`` set for the whole suite.

The protocol is one ``SOCK_SEQPACKET`` socket pair: a request carries the three standard
descriptors (``SCM_RIGHTS``); the server answers with the child's pid and, later, its exit
status, which it reads through the child's pidfd. The server stays single-threaded and runs no
torch operation, so forking it is as safe as a fork server's. When the test process goes away
(its end of the socket closes), the server kills the children still running and exits.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import itertools
import os
import pickle
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The command lines served warm: the two entry points and the benchmark scripts (each
# imports the engine; a script's own subprocesses, a benchmark's train.py, start cold).
SCRIPTS = {ROOT / "train.py", ROOT / "evaluate.py", *(ROOT / "bench").glob("*.py")}
PRELOAD = (  # what those scripts import, before and after Hydra composes
    "hydra",
    "omegaconf",
    "rl.utils.config",
    "rl.engine.sweeps",
    "rl.engine.cli",
    "rl.engine.run",
    "rl.training.stopping",
    "torch._dynamo",  # every torch.optim optimizer imports it
)
# Variables read while an interpreter starts or a module loads: a call that sets one differently
# from the warm interpreter's environment starts a real interpreter.
START_UP_VARIABLES = (
    "PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "NUMEXPR_", "LD_", "MALLOC_",
    "CUDA_", "TORCH", "PYTORCH_", "NCCL_", "GLIBC_",
)  # fmt: skip
UNBUFFERED = "PYTHONUNBUFFERED"  # honoured in the child: its streams are made unbuffered
START_TIMEOUT = 180.0  # seconds the warm interpreter may take to import (a loaded machine)
_MAX_MESSAGE = 1 << 20

_Popen = subprocess.Popen  # the real one, for everything not served warm
_cold_depth = 0  # >0: inside cold()
_client: _Client | None = None
_retired: list[_Client] = []  # earlier warm interpreters, ended at uninstall (children may run)
_client_lock = threading.RLock()


# ------------------------------------------------------------------------------ the server
def serve(fd: int) -> None:
    """The warm interpreter: import :data:`PRELOAD`, then fork a child per request on ``fd``."""
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the children; EOF ends this
    started_with = dict(os.environ)
    for name in PRELOAD:
        __import__(name)
    gc.collect()
    gc.freeze()  # as rl.engine.sweeps.load_engine does: the imports' objects are never walked
    # What the imports set (torch's TORCHINDUCTOR_CACHE_DIR, ...): each child gets it as a
    # fresh start's imports would give it, unless its own environment sets it.
    added = {k: v for k, v in os.environ.items() if k not in started_with}
    _send(sock, ("ready", os.getpid(), (started_with, added)))
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, None)
    children: dict[int, int] = {}  # pid -> pidfd
    try:
        while True:
            for key, _ in selector.select():
                if key.data is not None:  # a child's pidfd: it ended
                    pid = key.data
                    selector.unregister(key.fd)
                    os.close(children.pop(pid))
                    _, status = os.waitpid(pid, 0)
                    _send(sock, ("exit", pid, os.waitstatus_to_exitcode(status)))
                    continue
                received = _receive(sock)
                if received is None:  # the test process has gone
                    return
                (_, request_id, request), fds = received
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        _child(
                            {**request, "env": {**added, **request["env"]}}, fds, sock, selector
                        )
                finally:
                    for descriptor in fds:
                        os.close(descriptor)
                children[pid] = pidfd = os.pidfd_open(pid)
                selector.register(pidfd, selectors.EVENT_READ, pid)
                _send(sock, ("started", request_id, pid))
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _child(request: Mapping[str, Any], fds: list[int], sock: socket.socket, selector: Any) -> None:
    """In the forked child: become ``python script args...`` and exit as CPython would."""
    try:
        selector.close()
        sock.close()
        for target, descriptor in enumerate(fds):
            if descriptor != target:
                os.dup2(descriptor, target)  # inheritable, as the standard descriptors are
        keep = {0, 1, 2}
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request["start_new_session"]:
            os.setsid()
        if request["process_group"] >= 0:
            os.setpgid(0, request["process_group"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _fresh_streams(bool(request["env"].get(UNBUFFERED)))
        _fresh_randomness()
        script = request["argv"][1]
        sys.argv = list(request["argv"][1:])
        sys.orig_argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.realpath(script))
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    interrupted = False
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt as e:
        _print_uncaught(e, script)
        interrupted, code = True, 128 + signal.SIGINT  # (if the SIGINT below did not end it)
    except BaseException as e:
        _print_uncaught(e, script)
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # (CPython's exit: threads first)
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if interrupted:  # as CPython ends after an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _print_uncaught(error: BaseException, script: str) -> None:
    """Print ``error`` as CPython does, from the script's frame (not runpy's)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    if tb is not None:
        error.__traceback__ = tb  # (the hook prints the exception's own traceback)
    sys.excepthook(type(error), error, error.__traceback__)


def _exit_code(value: object) -> int:
    """The exit status of ``SystemExit(value)``, as CPython computes it."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _fresh_streams(unbuffered: bool) -> None:
    """``sys.stdin``, ``stdout`` and ``stderr`` on descriptors 0-2, buffered as a start would."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        mode = "rb" if fd == 0 else "wb"
        tty = os.isatty(fd)
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = unbuffered and fd != 0
        binary = (
            raw if buffered else (io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw))
        )
        stream = io.TextIOWrapper(
            binary,  # type: ignore[arg-type]
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=fd == 2 or (fd == 1 and tty),
            write_through=buffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _fresh_randomness() -> None:
    """Draw what a fresh interpreter draws at start (``random`` is reseeded by CPython)."""
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "multiprocessing.process" in sys.modules:
        sys.modules["multiprocessing.process"].current_process().authkey = os.urandom(32)


def _send(sock: socket.socket, message: object, fds: list[int] | None = None) -> None:
    data = pickle.dumps(message)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def _receive(sock: socket.socket) -> tuple[Any, list[int]] | None:
    """One message and its descriptors (None: the other end closed, or reset as it exited)."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
    except ConnectionResetError:
        return None
    if not data:
        return None
    return pickle.loads(data), list(fds)


# ------------------------------------------------------------------------------ the client
class _Client:
    """The test process's end: starts the warm interpreter, sends requests, collects exits."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._process = _Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()  # one reader of the socket at a time
        self._ids = itertools.count()
        self._started: dict[int, int | str] = {}
        self._exits: dict[int, int] = {}
        # The server's environment as started, and what its imports added to it
        self._ready: tuple[dict[str, str], dict[str, str]] | None = None
        self._dead = False
        self.pid = self._process.pid

    def ready(self) -> bool:
        """Wait until the warm interpreter has imported everything (False: it failed to)."""
        deadline = time.monotonic() + START_TIMEOUT
        while self._ready is None and not self._dead and time.monotonic() < deadline:
            self._pump(0.2)
        return self._ready is not None

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a child in ``env`` starts as a fresh interpreter would: ``env`` sets each
        start-up variable as the server's environment did, or as its imports then set it
        (a test process that has imported torch's inductor has ``TORCHINDUCTOR_CACHE_DIR``)."""
        assert self._ready is not None
        started_with, added = self._ready
        wanted = {k: v for k, v in _start_up_settings(env).items() if added.get(k) != v}
        return wanted == _start_up_settings(started_with)

    def spawn(self, request: dict[str, Any], fds: list[int]) -> int:
        """Fork a child for ``request``; its pid."""
        request_id = next(self._ids)
        with self._lock:
            _send(self._sock, ("spawn", request_id, request), fds)
        while request_id not in self._started:
            if self._dead:
                raise RuntimeError("the warm interpreter (tests/warm_cli.py) has died")
            self._pump(0.05)
        pid = self._started.pop(request_id)
        assert isinstance(pid, int)
        return pid

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """Child ``pid``'s exit code, waiting up to ``timeout`` s (None: forever; 0: a poll)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self._exits:
            if self._dead:
                raise RuntimeError(
                    f"the warm interpreter (tests/warm_cli.py) died before child {pid} ended"
                )
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            self._pump(max(left, 0.0))  # a poll (0 s) still reads what has arrived
            if left <= 0:
                return self._exits.get(pid)
        return self._exits[pid]

    def _pump(self, timeout: float) -> None:
        """Read what the server has sent within ``timeout`` s (one reader at a time)."""
        if not self._lock.acquire(timeout=timeout):
            return
        try:
            wait = timeout
            while not self._dead and select.select([self._sock], [], [], wait)[0]:
                wait = 0
                received = _receive(self._sock)
                if received is None:
                    self._dead = True
                    break
                (kind, key, value), _ = received
                if kind == "ready":
                    self._ready = value
                elif kind == "started":
                    self._started[key] = value
                elif kind == "exit":
                    self._exits[key] = value
        finally:
            self._lock.release()

    def close(self) -> None:
        self._sock.close()  # the server kills what still runs, and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=30)
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


def _warm_client(env: Mapping[str, str]) -> _Client | None:
    """A warm interpreter for a child in ``env``, started on first use (None: a real start).

    Where this process's own start-up settings have moved since its warm interpreter started
    (a module it imported set one: joblib sets ``KMP_INIT_AT_FORK``), a new one starts in its
    environment as it is now; one call's own setting gets a real start.
    """
    global _client
    with _client_lock:
        if _client is None:
            start()
        client = _client
        if client is None or not client.ready():
            return None
        if client.serves(env):
            return client
        if client.serves(os.environ):  # the call's own setting
            return None
        _retired.append(client)
        _client = client = _Client()
    return client if client.ready() and client.serves(env) else None


def _start_up_settings(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(START_UP_VARIABLES) and k != UNBUFFERED}


class WarmPopen(_Popen):  # type: ignore[misc,valid-type]
    """``subprocess.Popen`` that forks the warm interpreter for the command lines it serves."""

    _warm: _Client | None = None

    def _execute_child(  # type: ignore[override]
        self, args: Any, executable: Any, preexec_fn: Any, close_fds: bool, pass_fds: Any,
        cwd: Any, env: Any, startupinfo: Any, creationflags: Any, shell: bool,
        p2cread: int, p2cwrite: int, c2pread: int, c2pwrite: int, errread: int, errwrite: int,
        restore_signals: bool, gid: Any, gids: Any, uid: Any, umask: int,
        start_new_session: bool, process_group: Any,
    ) -> None:  # fmt: skip
        cold = (
            _cold_depth
            or shell
            or preexec_fn is not None
            or pass_fds
            or not close_fds
            or (gid, gids, uid) != (None, None, None)
            or umask >= 0
            or (executable is not None and os.fspath(executable) != sys.executable)
            or not _served(args, cwd)
        )
        environment = dict(os.environ if env is None else env)
        client = None if cold else _warm_client(environment)
        if client is None:
            super()._execute_child(
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                restore_signals, gid, gids, uid, umask, start_new_session, process_group,
            )  # fmt: skip
            return
        try:
            request = {
                "argv": [os.fsdecode(a) for a in args],
                "cwd": os.fsdecode(cwd) if cwd is not None else os.getcwd(),
                "env": {os.fsdecode(k): os.fsdecode(v) for k, v in environment.items()},
                "start_new_session": start_new_session,
                "process_group": process_group,
            }
            fds = [p2cread, c2pwrite, errwrite]
            fds = [fd if fd != -1 else default for fd, default in zip(fds, (0, 1, 2), strict=True)]
            self.pid = client.spawn(request, fds)
            self._child_created = True
            self._warm = client
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _internal_poll(self, _deadstate: Any = None, **kw: Any) -> int | None:
        if self._warm is None:
            return super()._internal_poll(_deadstate, **kw)  # type: ignore[no-any-return]
        if self.returncode is None:
            try:
                self.returncode = self._warm.exit_code(self.pid, 0)
            except RuntimeError:
                if _deadstate is None:
                    raise
                self.returncode = _deadstate
        return self.returncode  # type: ignore[no-any-return]

    def _wait(self, timeout: float | None) -> int:
        if self._warm is None:
            return super()._wait(timeout)  # type: ignore[no-any-return]
        if self.returncode is None:
            code = self._warm.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
            self.returncode = code
        return self.returncode  # type: ignore[no-any-return]


def _served(args: Any, cwd: Any) -> bool:
    """Whether ``args`` is ``[sys.executable, a script of SCRIPTS, ...]``."""
    if isinstance(args, str | bytes | os.PathLike) or len(args) < 2:
        return False
    program, script = (os.fsdecode(a) for a in args[:2])
    if program != sys.executable or script.startswith("-"):
        return False
    base = Path(os.fsdecode(cwd)) if cwd is not None else Path.cwd()
    return (base / script).resolve() in SCRIPTS


# ------------------------------------------------------------------------------ switches
def install() -> None:
    """Serve the command lines warm from now on (the warm interpreter starts on first use)."""
    subprocess.Popen = WarmPopen  # type: ignore[misc]


def uninstall() -> None:
    """Start real interpreters again and end the warm one."""
    global _client
    subprocess.Popen = _Popen  # type: ignore[misc]
    with _client_lock:
        for client in [*_retired, *([_client] if _client is not None else [])]:
            client.close()
        _retired.clear()
        _client = None


def start() -> None:
    """Start the warm interpreter now, in the background (it imports while tests run)."""
    global _client
    with _client_lock:
        if _client is None and hasattr(os, "pidfd_open"):
            if os.environ.get("RL_TEST_COLD_CLI") != "1":
                _client = _Client()


def server_pid() -> int | None:
    """The warm interpreter's pid (None: not started)."""
    return None if _client is None else _client.pid


@contextlib.contextmanager
def cold() -> Iterator[None]:
    """Real interpreters for every command line inside the block."""
    global _cold_depth
    _cold_depth += 1
    try:
        yield
    finally:
        _cold_depth -= 1


if __name__ == "__main__":
    serve(int(sys.argv[1]))
