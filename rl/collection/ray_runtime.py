"""Starting or joining Ray safely: a private instance on loopback with token authentication.

:func:`init_ray` replaces ``ray.init`` for ``collector=ray``:

- ``address=None``, a private instance: every Ray process binds to ``127.0.0.1`` only and token
  authentication is on, whatever ``RAY_AUTH_MODE`` says (with a warning). Ray binds loopback
  only when its node IP is exactly ``127.0.0.1``, which ``ray.init`` keeps only in its "local
  only" mode (``ray_constants.ENABLE_RAY_CLUSTER`` false), so that mode is switched on for the
  call. (Not through ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray reads it at import, and in the
  environment it makes ``ray start --address`` refuse in child processes.)
- ``auto`` or ``HOST:PORT``, a cluster: token authentication is required unless
  ``allow_unauthenticated`` opts out (a loud warning). A cluster with authentication disabled
  accepts a token-mode client too, so securing the cluster stays its operator's job.

:meth:`RayRuntime.shutdown` restores the environment variables changed. The signal handlers are
put back once ``ray.init`` returns: Ray's core worker installs its own for SIGTERM (a stack
dump, then an abort), which would end a run asked to stop while its workers start.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
AUTH_MODE_VAR = "RAY_AUTH_MODE"  # Ray's token authentication: "token" or "disabled"
TOKEN_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # where Ray looks first for the token
OPT_OUT_KEY = "collector.allow_unauthenticated"


class RaySecurityError(RuntimeError):
    """Ray would start or be joined without the required isolation or authentication."""


class RayRuntime:
    """The Ray instance :func:`init_ray` started or joined.

    Args:
        saved_env: The environment variables changed for it, with their previous values
            (None: unset before).
    """

    def __init__(self, *, saved_env: dict[str, str | None]) -> None:
        self._saved_env = saved_env
        self._active = True

    def shutdown(self) -> None:
        """``ray.shutdown()`` (a private instance ends), then restore the environment."""
        if not self._active:
            return
        self._active = False
        import ray

        try:
            ray.shutdown()
        finally:
            _restore_env(self._saved_env)


def init_ray(
    *,
    address: str | None,
    num_cpus: int | None = None,
    allow_unauthenticated: bool = False,
    logging_level: int = logging.WARNING,
) -> RayRuntime:
    """Start a private Ray instance (``address=None``) or join a cluster, safely.

    Args:
        address: None: a private instance on this machine; ``auto`` or ``HOST:PORT``: join that
            cluster.
        num_cpus: CPUs of a private instance (None: Ray counts them).
        allow_unauthenticated: Cluster only: join even without token authentication.
        logging_level: Ray's log level in this process.

    Raises:
        RaySecurityError: Joining a cluster without token authentication and without the
            opt-out, or a private instance that did not come up on loopback.
    """
    import ray

    saved: dict[str, str | None] = {}
    try:
        if address is None:
            _force_token_auth(saved)
            with _local_only(), _signal_handlers_kept():
                ray.init(
                    address="local",
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    dashboard_host=LOOPBACK,
                    logging_level=logging_level,
                    _node_ip_address=LOOPBACK,
                )
            node_ip = ray.util.get_node_ip_address()
            if not ipaddress.ip_address(node_ip).is_loopback:
                ray.shutdown()
                raise RaySecurityError(
                    f"the private Ray instance came up on {node_ip}, not on loopback: refusing "
                    "to run it reachable from the network (has Ray changed how it picks its "
                    "node IP address?)"
                )
            log.info(
                "private Ray instance on %s only, token authentication on (%s=token)",
                node_ip,
                AUTH_MODE_VAR,
            )
        else:
            _require_cluster_auth(saved, address, allow_unauthenticated)
            with _signal_handlers_kept():
                ray.init(address=address, logging_level=logging_level)
    except BaseException:
        _restore_env(saved)
        raise
    return RayRuntime(saved_env=saved)


def _force_token_auth(saved: dict[str, str | None]) -> None:
    """Token authentication for the private instance, a token in place (as Ray makes it)."""
    mode = os.environ.get(AUTH_MODE_VAR)
    if mode is not None and mode.lower() != "token":
        log.warning(
            "%s=%s in the environment is overridden for the private Ray instance: it starts "
            "with token authentication (%s=token), which it always uses",
            AUTH_MODE_VAR,
            mode,
            AUTH_MODE_VAR,
        )
    _set_env(saved, AUTH_MODE_VAR, "token")
    _refresh_ray_config()
    if not _has_token() and not any(name in os.environ for name in TOKEN_VARS):
        _write_default_token()  # (a token variable set in vain is Ray's to report)


def _require_cluster_auth(
    saved: dict[str, str | None], address: str, allow_unauthenticated: bool
) -> None:
    """Token authentication for joining ``address``, unless opted out (loudly)."""
    mode = os.environ.get(AUTH_MODE_VAR)
    if mode is not None and mode.lower() == "token":
        return
    now = f"{AUTH_MODE_VAR}={mode}" if mode is not None else f"{AUTH_MODE_VAR} is unset"
    if allow_unauthenticated:  # the environment is left as it is: Ray decides
        log.warning(
            "JOINING RAY AT %s POSSIBLY WITHOUT TOKEN AUTHENTICATION (%s; %s=true): anyone "
            "who can reach that cluster can run code on it and read what it holds. Set %s=token "
            "and the cluster's token (%s, %s or ~/.ray/auth_token) to authenticate.",
            address,
            now,
            OPT_OUT_KEY,
            AUTH_MODE_VAR,
            *TOKEN_VARS,
        )
        return
    if mode is None and _has_token():
        _set_env(saved, AUTH_MODE_VAR, "token")  # what Ray does itself for address="auto"
        _refresh_ray_config()
        log.info("joining Ray at %s with token authentication (%s=token)", address, AUTH_MODE_VAR)
        return
    if mode is None:
        now += " and no token was found"
    raise RaySecurityError(
        f"collector.address={address}: joining a Ray cluster requires token authentication, "
        f"but {now}. Set {AUTH_MODE_VAR}=token and the cluster's token ({TOKEN_VARS[0]}, "
        f"{TOKEN_VARS[1]} or ~/.ray/auth_token), or set {OPT_OUT_KEY}=true to join without "
        "authentication (anyone who can reach the cluster can run code on it)."
    )


@contextlib.contextmanager
def _local_only() -> Iterator[None]:
    """Ray's "local only" mode in this process: its node IP address is ``127.0.0.1``."""
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Put this process's SIGTERM, SIGINT and SIGUSR1 handlers back after the block.

    ``ray.init`` installs C-level handlers behind Python's back (``signal.getsignal`` still
    names the old ones): setting them again makes Python's run. Main thread only, as Python
    allows.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = ("SIGTERM", "SIGINT", "SIGUSR1")  # (as stop_on_signals: those this platform has)
    sigs = [getattr(signal, n) for n in names if hasattr(signal, n)]
    before = {sig: signal.getsignal(sig) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # (None: not set from Python; nothing to put back)
                signal.signal(sig, handler)


def _has_token() -> bool:
    """Whether Ray finds a token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, the default)."""
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

    return bool(AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True))


def _write_default_token() -> None:
    """A new token where Ray keeps it (``~/.ray/auth_token``), readable by this user only."""
    from ray._private.authentication.authentication_token_generator import (
        generate_new_authentication_token,
    )
    from ray._private.authentication.authentication_token_setup import _get_default_token_path
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]

    path = Path(_get_default_token_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(generate_new_authentication_token())
    AuthenticationTokenLoader.instance().reset_cache()
    log.info("generated a Ray authentication token in %s", path)


def _refresh_ray_config() -> None:
    """Make this process's cached Ray configuration read ``RAY_AUTH_MODE`` again."""
    from ray._raylet import Config  # type: ignore[attr-defined]

    Config.initialize("")


def _set_env(saved: dict[str, str | None], name: str, value: str) -> None:
    saved.setdefault(name, os.environ.get(name))
    os.environ[name] = value


def _restore_env(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if AUTH_MODE_VAR in saved:
        _refresh_ray_config()
    saved.clear()
