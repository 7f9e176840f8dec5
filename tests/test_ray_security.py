"""The Ray that ``collector=ray`` starts or joins (:mod:`rl.collection.ray_runtime`): a private
instance listens on loopback only and always uses token authentication; joining a cluster
without token authentication needs the ``collector.allow_unauthenticated`` opt-out.

Each test runs its own Python in a subprocess (Ray allows one instance per process, and the
session's ``ray_instance`` may be live in this one); the scripts shut their Ray instance down
by its handle in ``finally``, and a script that overruns is killed with everything it started.
Their HOME is a temporary folder, so a token Ray needs is generated there, not in ~/.ray.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
# Variables that would decide the outcome for the scripts instead of the code under test.
RAY_VARS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")  # fmt: skip


def script_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RAY_VARS}
    return {**env, "HOME": str(home), "WANDB_MODE": "disabled", **extra}


def run_script(code: str, env: dict[str, str], timeout: float) -> tuple[dict[str, Any], str]:
    """Run ``code`` in a new Python; returns (the JSON its last stdout line holds, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = psutil.Process(proc.pid).children(recursive=True)
        proc.kill()
        for child in tree:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        out, err = proc.communicate()
        pytest.fail(f"the script ran over {timeout} s; stderr:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # [::ffff:127.0.0.1]
    return address.is_loopback


# A private instance as collector=ray starts it: two Ray workers collecting a debug task. The
# script lists every socket listening (TCP) or bound (UDP) in the driver and everything it
# started, and tries each of their ports at the machine's network addresses.
PRIVATE_COLLECTORS = """
    import json, os, socket, sys
    import psutil
    from rl.collection import CollectionSpec, RolloutRequest
    from rl.collection.worker_set import CollectionWorkerSet
    from rl.models import build_policy
    from rl.tasks import task_spaces
    sys.path.insert(0, "tests")
    from collectors import worker_settings  # conf/collector/ray.yaml's settings

    task = {"_target_": "rl_envs.toys.debug.FaultyEnv", "max_steps": 10}
    sampler = {"_target_": "rl.sampling.SerialSampler", "_partial_": True, "num_envs": 2}
    model = {"_target_": "rl.models.ActorCritic", "_partial_": True, "cnn_channels": [8],
             "trunk_layers": [16], "rnn": "gru", "rnn_hidden_size": 8}
    spec = CollectionSpec(task=task, sampler=sampler, model=model, seed=1)
    policy = build_policy(spec.model, *task_spaces(spec.task))
    workers = CollectionWorkerSet(spec=spec, model=policy, **worker_settings(backend="ray"))
    try:
        workers.collect(RolloutRequest(num_steps=4))  # every Ray process has started by now
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        sockets = []
        for p in procs:
            try:
                name, conns = p.name(), p.net_connections(kind="inet")
            except psutil.Error:
                continue
            for c in conns:
                if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr):
                    sockets.append({"pid": p.pid, "name": name, "ip": c.laddr.ip,
                                    "port": c.laddr.port, "udp": c.type == socket.SOCK_DGRAM})
        outside = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                   if a.family in (socket.AF_INET, socket.AF_INET6)
                   and not a.address.startswith(("127.", "::1", "fe80"))]
        reached = []
        for ip in outside:
            for s in sockets:
                if s["udp"]:
                    continue
                family = socket.AF_INET6 if ":" in ip else socket.AF_INET
                with socket.socket(family, socket.SOCK_STREAM) as probe:
                    probe.settimeout(2)
                    if probe.connect_ex((ip, s["port"])) == 0:
                        reached.append(f"{ip}:{s['port']} ({s['name']})")
        result = {"sockets": sockets, "worker_pids": workers.pids, "outside": outside,
                  "reached": reached, "auth_mode_during": os.environ.get("RAY_AUTH_MODE")}
    finally:
        workers.close()  # shuts the private instance down by its handle
    result["auth_mode_after"] = os.environ.get("RAY_AUTH_MODE")
    print(json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_private_instance_listens_on_loopback_only(tmp_path: Path) -> None:
    start = time.monotonic()
    result, _ = run_script(PRIVATE_COLLECTORS, script_env(tmp_path), timeout=180)
    sockets = result["sockets"]
    names = {s["name"] for s in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # the scan sees Ray's daemons ...
    assert set(result["worker_pids"]) <= {s["pid"] for s in sockets}, sockets  # ... and workers
    exposed = [s for s in sockets if not is_loopback(s["ip"])]
    assert exposed == [], f"Ray sockets on non-loopback addresses: {exposed}"
    assert result["reached"] == [], result  # nothing answers at the machine's own addresses
    assert result["auth_mode_during"] == "token"
    assert result["auth_mode_after"] is None  # the environment is restored at shutdown
    assert time.monotonic() - start < 180


# A private instance started with RAY_AUTH_MODE=disabled in the environment: it comes up in
# token mode. Calls to its GCS without the token (or with a wrong one) are refused. The
# process's own SIGTERM handler (a run's: save, then exit 143) still runs once Ray is up, not
# the stack dump and abort Ray's core worker installs.
PRIVATE_WITH_AUTH_DISABLED = """
    import json, logging, os, signal, time
    import grpc, psutil, ray
    from pathlib import Path
    from ray._raylet import AuthenticationMode, get_authentication_mode
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    from rl.collection.ray_runtime import init_ray

    logging.basicConfig(level=logging.WARNING)
    received = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    runtime = init_ray(address=None, num_cpus=1)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        gcs = ray.get_runtime_context().gcs_address
        token_file = Path.home() / ".ray" / "auth_token"
        token = token_file.read_text().strip()
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(grpc.insecure_channel(gcs))

        def call(header):
            metadata = None if header is None else [("authorization", header)]
            try:
                stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=10,
                                    metadata=metadata)
                return "OK"
            except grpc.RpcError as e:
                return e.code().name

        daemons = {}
        for p in psutil.Process().children(recursive=True):
            if p.name() in ("gcs_server", "raylet"):
                daemons[p.name()] = p.environ().get("RAY_AUTH_MODE")
        result = {
            "driver_token_mode": get_authentication_mode() == AuthenticationMode.TOKEN,
            "daemons": daemons,
            "token_file_mode": oct(token_file.stat().st_mode & 0o777),
            "anonymous": call(None),
            "wrong_token": call("Bearer " + "0" * 64),
            "token": call("Bearer " + token),
            "sigterm_handled": received == [signal.SIGTERM],
        }
    finally:
        runtime.shutdown()
    result["auth_mode_after"] = os.environ.get("RAY_AUTH_MODE")
    print(json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_auth_mode_disabled_in_the_environment_still_starts_a_token_instance(
    tmp_path: Path,
) -> None:
    env = script_env(tmp_path, RAY_AUTH_MODE="disabled")
    result, err = run_script(PRIVATE_WITH_AUTH_DISABLED, env, timeout=120)
    assert "RAY_AUTH_MODE=disabled in the environment is overridden" in err
    assert result["driver_token_mode"] is True
    assert result["daemons"] == {"gcs_server": "token", "raylet": "token"}
    assert result["anonymous"] == "UNAUTHENTICATED"
    assert result["wrong_token"] == "UNAUTHENTICATED"
    assert result["token"] == "OK"
    assert result["token_file_mode"] == "0o600"  # generated in the (temporary) HOME
    assert result["auth_mode_after"] == "disabled"  # the environment is restored at shutdown
    assert result["sigterm_handled"] is True  # (without the fix: exit -6, Ray's abort)


# Joining a cluster: ray.init is replaced by a stub, so nothing is joined or started.
JOIN_A_CLUSTER = """
    import json, logging, os
    import ray
    from rl.collection.ray_runtime import RaySecurityError, init_ray

    warnings = []
    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())
    logging.getLogger("rl.collection.ray_runtime").addHandler(Keep(logging.WARNING))
    joined = []
    ray.init = lambda **kwargs: joined.append(kwargs)
    ray.shutdown = lambda: None

    def join(**kwargs):
        try:
            runtime = init_ray(address="10.1.2.3:6379", **kwargs)
        except RaySecurityError as e:
            return {"error": str(e), "mode": os.environ.get("RAY_AUTH_MODE")}
        mode = os.environ.get("RAY_AUTH_MODE")
        runtime.shutdown()
        return {"joined": joined.pop(), "mode": mode, "after": os.environ.get("RAY_AUTH_MODE")}

    result = {}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    result["disabled"] = join()
    result["opt_out"] = join(allow_unauthenticated=True)
    result["opt_out_warnings"] = warnings
    del os.environ["RAY_AUTH_MODE"]
    result["unset_no_token"] = join()
    os.environ["RAY_AUTH_TOKEN"] = "f" * 64
    result["unset_with_token"] = join()
    os.environ["RAY_AUTH_MODE"] = "token"
    result["token"] = join()
    print(json.dumps(result))
"""


@pytest.mark.timeout(120)
def test_joining_a_cluster_requires_token_auth_unless_opted_out(tmp_path: Path) -> None:
    result, _ = run_script(JOIN_A_CLUSTER, script_env(tmp_path), timeout=90)
    refused = result["disabled"]
    assert "RAY_AUTH_MODE=disabled" in refused["error"]
    assert "collector.allow_unauthenticated=true" in refused["error"]
    assert "collector.address=10.1.2.3:6379" in refused["error"]
    assert refused["mode"] == "disabled"  # left as it was
    unset = result["unset_no_token"]
    assert "RAY_AUTH_MODE is unset and no token was found" in unset["error"]
    assert "collector.allow_unauthenticated" in unset["error"]
    # Opting out: joined, with a loud warning naming the key and the variable.
    assert result["opt_out"]["joined"]["address"] == "10.1.2.3:6379"
    assert result["opt_out"]["mode"] == "disabled"
    (warning,) = result["opt_out_warnings"]
    assert "WITHOUT TOKEN AUTHENTICATION" in warning
    assert "RAY_AUTH_MODE=disabled" in warning and "collector.allow_unauthenticated" in warning
    # RAY_AUTH_MODE unset but a token at hand: token mode for the join, restored afterwards.
    assert result["unset_with_token"]["mode"] == "token"
    assert result["unset_with_token"]["after"] is None
    assert result["token"]["joined"]["address"] == "10.1.2.3:6379"
