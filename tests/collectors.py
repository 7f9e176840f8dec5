"""Collection worker sets built by tests in Python, with ``conf/collector/ray.yaml``'s settings.

The YAML is where the ``collector`` settings' values live (``CollectionWorkerSet`` declares them,
typed and ranged, without defaults); a test building one by hand takes them from there and
overrides what it tests: ``CollectionWorkerSet(spec=..., model=..., **worker_settings(...))``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CONF = Path(__file__).resolve().parents[1] / "conf" / "collector"


def worker_settings(**overrides: Any) -> dict[str, Any]:
    """``conf/collector/ray.yaml``'s settings with ``overrides``, and ``device="cpu"``."""
    raw = yaml.safe_load((CONF / "ray.yaml").read_text(encoding="utf-8"))
    values = {k: v for k, v in raw.items() if not k.startswith("_")}
    return {"device": "cpu", **values, **overrides}
