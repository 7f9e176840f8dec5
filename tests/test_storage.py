"""Advantage estimation against plain reference loops, and the rollout storage's minibatches."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rl.storage import (
    GAE,
    RolloutStorage,
    advantage_stats_of,
    compute_discounted_returns,
    compute_gae,
    sequence_start_state,
)

T, N = 23, 6


def _random_rollout(seed: int, t: int = T, n: int = N) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ended = torch.rand(t, n, generator=g) < 0.3
    is_term = torch.rand(t, n, generator=g) < 0.5
    terminated = ended & is_term
    truncated = ended & ~is_term
    # Make sure both kinds occur (never at once).
    terminated[3, 0], truncated[3, 0] = True, False
    terminated[5, 1], truncated[5, 1] = False, True
    return {
        "rewards": torch.randn(t, n, generator=g, dtype=torch.float64),
        "values": torch.randn(t, n, generator=g, dtype=torch.float64),
        "next_value": torch.randn(n, generator=g, dtype=torch.float64),
        "terminated": terminated,
        "truncated": truncated,
        "truncation_values": torch.randn(t, n, generator=g, dtype=torch.float64),
    }


def _reference_gae(r, gamma: float, lam: float) -> torch.Tensor:
    t_len, n = r["values"].shape
    adv = torch.zeros(t_len, n, dtype=torch.float64)
    for env in range(n):
        running = 0.0
        for t in reversed(range(t_len)):
            reward = r["rewards"][t, env].item()
            value = r["values"][t, env].item()
            if r["terminated"][t, env]:
                delta = reward - value
                running = delta
            elif r["truncated"][t, env]:
                delta = reward + gamma * r["truncation_values"][t, env].item() - value
                running = delta
            else:
                if t == t_len - 1:
                    next_v = r["next_value"][env].item()
                else:
                    next_v = r["values"][t + 1, env].item()
                delta = reward + gamma * next_v - value
                running = delta + gamma * lam * running
            adv[t, env] = running
    return adv


def _reference_returns(r, gamma: float) -> torch.Tensor:
    t_len, n = r["values"].shape
    ret = torch.zeros(t_len, n, dtype=torch.float64)
    for env in range(n):
        running = r["next_value"][env].item()
        for t in reversed(range(t_len)):
            reward = r["rewards"][t, env].item()
            if r["terminated"][t, env]:
                running = reward
            elif r["truncated"][t, env]:
                running = reward + gamma * r["truncation_values"][t, env].item()
            else:
                running = reward + gamma * running
            ret[t, env] = running
    return ret


GAMMA_LAMBDA = [(0.99, 0.95), (0.9, 0.0), (0.97, 1.0), (0.5, 0.7)]


def test_random_rollout_has_both_kinds_of_ending() -> None:
    r = _random_rollout(0)
    assert r["terminated"].any() and r["truncated"].any()
    assert not (r["terminated"] & r["truncated"]).any()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("gamma", "lam"), GAMMA_LAMBDA)
def test_gae_matches_reference(seed: int, gamma: float, lam: float) -> None:
    r = _random_rollout(seed)
    adv, ret = compute_gae(**r, gamma=gamma, gae_lambda=lam)
    expected = _reference_gae(r, gamma, lam)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + r["values"])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [0.99, 0.9, 0.5])
def test_discounted_returns_match_reference(seed: int, gamma: float) -> None:
    r = _random_rollout(seed)
    adv, ret = compute_discounted_returns(**r, gamma=gamma)
    expected = _reference_returns(r, gamma)
    torch.testing.assert_close(ret, expected)
    torch.testing.assert_close(adv, expected - r["values"])


def _one_env(t_len: int, end_at: int, kind: str) -> dict[str, torch.Tensor]:
    z = torch.zeros(t_len, 1, dtype=torch.float64)
    ended = torch.zeros(t_len, 1, dtype=torch.bool)
    ended[end_at] = True
    no = torch.zeros_like(ended)
    return {
        "rewards": z.clone(),
        "values": z.clone(),
        "next_value": torch.full((1,), 100.0, dtype=torch.float64),
        "terminated": ended if kind == "terminated" else no,
        "truncated": ended if kind == "truncated" else no,
        "truncation_values": torch.full((t_len, 1), 7.0, dtype=torch.float64),
    }


@pytest.mark.parametrize("estimator", ["gae", "returns"])
def test_truncation_bootstraps_final_value_and_termination_does_not(estimator: str) -> None:
    gamma = 0.9

    def run(r):
        if estimator == "gae":
            return compute_gae(**r, gamma=gamma, gae_lambda=0.8)
        return compute_discounted_returns(**r, gamma=gamma)

    _, ret_trunc = run(_one_env(4, 1, "truncated"))
    _, ret_term = run(_one_env(4, 1, "terminated"))
    # At the truncation: reward 0 + gamma * V(final obs) = 0.9 * 7.
    assert ret_trunc[1, 0].item() == pytest.approx(gamma * 7.0)
    assert ret_term[1, 0].item() == pytest.approx(0.0)
    # After the boundary the next episode bootstraps from next_value (100) only.
    assert ret_trunc[3, 0].item() == pytest.approx(gamma * 100.0)
    assert ret_trunc[2, 0].item() == pytest.approx(ret_term[2, 0].item())


@pytest.mark.parametrize("kind", ["terminated", "truncated"])
def test_gae_trace_does_not_leak_across_episode_boundary(kind: str) -> None:
    base = _one_env(6, 2, kind)
    changed = {k: v.clone() for k, v in base.items()}
    changed["rewards"][3:] += 5.0  # only the next episode changes
    changed["next_value"] += 3.0
    adv_a, _ = compute_gae(**base, gamma=0.99, gae_lambda=0.95)
    adv_b, _ = compute_gae(**changed, gamma=0.99, gae_lambda=0.95)
    torch.testing.assert_close(adv_a[:3], adv_b[:3])
    assert not torch.allclose(adv_a[3:], adv_b[3:])
    ret_a, _ = compute_discounted_returns(**base, gamma=0.99)
    ret_b, _ = compute_discounted_returns(**changed, gamma=0.99)
    torch.testing.assert_close(ret_a[:3], ret_b[:3])


# ------------------------------------------------------------------- storage
def _storage(num_envs: int, capacity: int = 5) -> RolloutStorage:
    return RolloutStorage(num_steps=capacity, num_envs=num_envs, device="cpu")


def _state(values: torch.Tensor) -> TensorDict:
    """A GRU-like state ``{"h": [N, 1, 3]}`` holding ``values`` ``[N]``."""
    return TensorDict({"h": values.view(-1, 1, 1).expand(-1, 1, 3)}, batch_size=values.shape)


def _step(n: int, t: int, env_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "actions": torch.arange(n) + 1000 * t,
        "logprobs": env_ids,
        "values": env_ids + 0.5,
        "rewards": torch.full((n,), float(t)),
        "terminated": torch.zeros(n, dtype=torch.bool),
        "truncated": torch.zeros(n, dtype=torch.bool),
        "truncation_values": torch.zeros(n),
        "expert_actions": torch.full((n,), -1),
    }


def _fill(storage: RolloutStorage, steps: int, states: bool = True) -> None:
    """Tag every entry with its env index (and step) so minibatches can be checked."""
    n = storage.num_envs
    env_ids = torch.arange(n, dtype=torch.float32)
    storage.set_first(
        {"x": env_ids[:, None].expand(n, 2)}, torch.ones(n, dtype=torch.bool), _state(env_ids)
    )
    for t in range(steps):
        storage.insert(
            _step(n, t, env_ids),
            {"x": env_ids[:, None].expand(n, 2)},
            _state(env_ids) if states else None,
        )


@pytest.mark.parametrize(("num_envs", "num_mb"), [(8, 4), (10, 4), (7, 7), (5, 1)])
def test_minibatches_partition_envs_and_keep_whole_sequences(num_envs: int, num_mb: int) -> None:
    storage = _storage(num_envs)
    storage.reset()
    _fill(storage, storage.capacity)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        batches = list(storage.minibatches(num_mb, generator=g))
        assert len(batches) == num_mb
        sizes = [b["actions"].shape[1] for b in batches]
        assert max(sizes) - min(sizes) <= 1
        seen: list[int] = []
        for b in batches:
            envs = b["logprobs"][0].long().tolist()
            seen += envs
            assert b["actions"].shape == (storage.capacity, len(envs))
            assert b.batch_size == (storage.capacity, len(envs))
            # All T steps of each env, in time order, consistent across fields.
            steps = torch.arange(storage.capacity)[:, None]
            torch.testing.assert_close(b["actions"], torch.tensor(envs)[None] + 1000 * steps)
            torch.testing.assert_close(b["values"], b["logprobs"] + 0.5)
            torch.testing.assert_close(b["obs", "x"][..., 0], b["logprobs"])
            start = sequence_start_state(b)
            assert start.batch_size == (len(envs),)
            torch.testing.assert_close(start["h"][:, 0, 0], b["logprobs"][0])
            assert b.numel() == storage.capacity * len(envs)
        assert sorted(seen) == list(range(num_envs))


def test_minibatches_shuffle_envs() -> None:
    storage = _storage(16)
    _fill(storage, 5)
    g = torch.Generator().manual_seed(0)
    orders = {tuple(b["logprobs"][0].long().tolist()) for b in storage.minibatches(1, g)}
    orders |= {tuple(b["logprobs"][0].long().tolist()) for b in storage.minibatches(1, g)}
    assert len(orders) == 2


def test_more_minibatches_than_envs_raises() -> None:
    storage = _storage(3)
    _fill(storage, 5)
    with pytest.raises(ValueError, match="num_mini_batch"):
        list(storage.minibatches(4))


def test_shorter_rollout_than_capacity() -> None:
    storage = _storage(4, capacity=8)
    _fill(storage, 8)
    storage.reset(3)
    _fill(storage, 3)
    with pytest.raises(RuntimeError):
        _fill(storage, 1)  # a fourth step does not fit
    for b in storage.minibatches(2):
        assert b["actions"].shape[0] == 3
        assert b["obs", "x"].shape[0] == 3
    assert storage.rows().batch_size == (4, 4)  # three steps and the observation after them
    GAE(gae_lambda=1.0)(storage, model=torch.nn.Identity(), next_value=torch.zeros(4), gamma=1.0)
    # Rewards 0, 1, 2 with gamma 1 and a zero bootstrap: returns are the suffix sums.
    torch.testing.assert_close(storage["returns"][:3, 0], torch.tensor([3.0, 3.0, 2.0]))


@pytest.mark.parametrize("bad", [0, 9])
def test_reset_rejects_lengths_outside_capacity(bad: int) -> None:
    with pytest.raises(ValueError):
        _storage(2, capacity=8).reset(bad)


def test_chunks_need_the_recorded_recurrent_states() -> None:
    """A rollout inserted without per-step states can only give whole-rollout minibatches."""
    storage = _storage(4, capacity=8)
    storage.reset()
    _fill(storage, 8, states=False)  # nothing for chunks to start from
    assert not storage.states_recorded
    assert len(list(storage.minibatches(2, recurrence=0))) == 2
    with pytest.raises(ValueError, match="recurrence=4: .* without per-step recurrent states"):
        list(storage.minibatches(2, recurrence=4))
    storage.reset()  # a new rollout starts recorded again
    assert storage.states_recorded


def test_chunks_start_from_the_state_stored_at_their_first_step() -> None:
    storage = _storage(2, capacity=8)
    storage.reset()
    n = 2
    storage.set_first(
        {"x": torch.zeros(n, 2)}, torch.ones(n, dtype=torch.bool), _state(torch.zeros(n))
    )
    for t in range(8):  # the state after step t is 100 * (t + 1) + env
        after = 100.0 * (t + 1) + torch.arange(n, dtype=torch.float32)
        storage.insert(
            _step(n, t, torch.arange(n, dtype=torch.float32)),
            {"x": torch.zeros(n, 2)},
            _state(after),
        )
    for b in storage.minibatches(4, torch.Generator().manual_seed(0), recurrence=2):
        first_step = b["actions"][0] // 1000  # the chunk's first step
        env = b["actions"][0] % 1000
        expected = torch.where(first_step == 0, 0.0, 100.0 * first_step + env)
        torch.testing.assert_close(sequence_start_state(b)["h"][:, 0, 0], expected.float())


def test_a_new_field_is_recorded_and_carried_without_declaring_it() -> None:
    """Any key a component inserts is allocated on first sight and reaches every minibatch,
    with its own shape and dtype; the advantage statistics travel with the minibatches."""
    storage = _storage(4, capacity=6)
    n = 4
    env_ids = torch.arange(n, dtype=torch.float32)
    storage.set_first(
        {"x": torch.zeros(n, 2)}, torch.ones(n, dtype=torch.bool), TensorDict({}, [n])
    )
    for t in range(6):
        extra = {"aux/target": torch.stack([env_ids, torch.full((n,), float(t))], dim=-1),
                 "parity": torch.full((n,), t % 2, dtype=torch.int8)}  # fmt: skip
        storage.insert({**_step(n, t, env_ids), **extra}, {"x": torch.zeros(n, 2)})
    storage.advantage_stats = (0.5, 2.0)
    for b in storage.minibatches(2, torch.Generator().manual_seed(1)):
        assert b["aux/target"].shape == (6, 2, 2) and b["parity"].dtype == torch.int8
        torch.testing.assert_close(b["aux/target"][..., 0], b["logprobs"])
        torch.testing.assert_close(b["aux/target"][:, 0, 1], torch.arange(6.0))
        assert advantage_stats_of(b) == (0.5, 2.0)
        assert "state" not in b.keys()  # a memoryless policy records no state
        assert sequence_start_state(b).batch_size == (2,)
