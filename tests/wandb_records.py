"""Read the records of an offline wandb run file (``run-<id>.wandb``), for tests.

The file is a LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of chunks with a
7-byte header: CRC32, length, type FULL/FIRST/MIDDLE/LAST), each record a serialized
``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2 as pb

_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[Any]:
    """Every ``Record`` of a run file, in order."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", data[:7]
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer: padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding up to the block end
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (_FULL, _FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class OfflineRun:
    """What a run file says: run fields, config, history keys, summary, metric definitions."""

    run: Any
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[Any] = field(default_factory=list)
    artifacts: list[Any] = field(default_factory=list)

    @property
    def history_keys(self) -> set[str]:
        """Every key logged to the history."""
        return set().union(*self.history) if self.history else set()


def read_run(path: Path) -> OfflineRun:
    """Parse ``run-<id>.wandb`` into an :class:`OfflineRun`."""
    runs, out = [], None
    records = read_records(path)
    for r in records:
        if r.WhichOneof("record_type") == "run":
            runs.append(r.run)
    assert runs, "no run record"
    out = OfflineRun(run=runs[0])
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "run" or kind == "config":
            for item in (r.run.config if kind == "run" else r.config).update:
                out.config[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            out.history.append({_key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            for item in r.summary.update:
                out.summary[_key(item)] = json.loads(item.value_json)
        elif kind == "metric":
            out.metrics.append(r.metric)
        elif kind == "artifact":
            out.artifacts.append(r.artifact)
    return out
