"""``python -m rl.compare PATH ...``: runs compared by override (:mod:`rl.evaluation.compare`)."""

from __future__ import annotations

import sys

from rl.evaluation.compare import main

if __name__ == "__main__":
    sys.exit(main())
