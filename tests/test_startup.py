"""A process that never compiles never imports ``torch._dynamo`` (rl/utils/dynamo.py).

Each check runs in a fresh interpreter: whether dynamo is loaded is a property of the whole
process, and this test process has long since loaded it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

# What tensordict marks for torch.compile, by name: {module.attr: [allowed in graph, constant]}.
MARKS = """
import json, sys, types
import tensordict
import torch._dynamo
from torch._dynamo import trace_rules
marks = {}
for name, module in sorted(sys.modules.items()):
    if not name.startswith("tensordict") or not isinstance(module, types.ModuleType):
        continue
    for attr, value in vars(module).items():
        allowed = callable(value) and id(value) in trace_rules._allowed_callable_ids
        constant = getattr(value, "_dynamo_marked_constant", False) is True
        if allowed or constant:
            marks[f"{name}.{attr}"] = [allowed, constant]
print(json.dumps(marks))
"""


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_no_module_of_rl_imports_dynamo_nor_does_a_policy_acting() -> None:
    # Every module (what the CLIs, a sampler process and a collection worker import), then a
    # GRU core running: it is marked to run eagerly under compile.
    code = """
import importlib, pkgutil, sys
import rl
for module in pkgutil.walk_packages(rl.__path__, "rl."):
    importlib.import_module(module.name)
import torch
from rl.models.gru import gru_sequence
rnn = torch.nn.GRU(4, 8)
starts = torch.zeros(5, 3, dtype=torch.bool)
gru_sequence(rnn, torch.randn(5, 3, 4), starts, torch.zeros(1, 3, 8))
print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
"""
    assert run(code) == "[]"


def test_once_dynamo_is_imported_tensordict_carries_every_mark_it_would_have() -> None:
    deferred = json.loads(run("import rl.engine.run\n" + MARKS))
    first = json.loads(run("import torch._dynamo\nimport rl.engine.run\n" + MARKS))
    assert first, "tensordict marks nothing for torch.compile any more: see rl/utils/dynamo.py"
    assert deferred == first


def test_the_recurrent_cores_run_eagerly_under_compile() -> None:
    from rl.models.gru import gru_sequence

    rnn = torch.nn.GRU(4, 8)
    x, hidden = torch.randn(5, 3, 4), torch.zeros(1, 3, 8)
    starts = torch.zeros(5, 3, dtype=torch.bool)
    starts[2, 1] = True

    def traced_ops(core) -> tuple[torch.Tensor, set[str]]:
        ops: set[str] = set()

        def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
            ops.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
            return gm.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            return (core(rnn, (x * 2).sin() + 1, starts, hidden)[0].sin() * 3).sum()

        torch._dynamo.reset()
        out = torch.compile(forward, backend=backend)(x)
        torch.testing.assert_close(out, forward(x))
        return out, ops

    _, ops = traced_ops(gru_sequence)
    assert not any("addmm" in op for op in ops), ops  # the core ran eagerly
    _, ops = traced_ops(gru_sequence.__wrapped__)  # (the same function, unmarked, is traced)
    assert any("addmm" in op for op in ops), ops
