"""The small-PointNav learning test with an LSTM policy: the GRU's threshold, the GRU's budget.

In a module of its own so that the two test processes run it beside the GRU's
(``--dist loadfile`` keeps a module in one process).
"""

from __future__ import annotations

import pytest
from test_learning import test_ppo_learns_small_pointnav as learns_small_pointnav

pytestmark = [pytest.mark.slow, pytest.mark.learning]


def test_ppo_learns_small_pointnav_with_an_lstm(compose_cfg) -> None:
    learns_small_pointnav(compose_cfg, rnn="lstm")
