"""ActorCritic over different observation spaces, and recurrent re-evaluation of a real rollout."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl.models import ActorCritic
from rl.models import distributions as D
from rl.sampling import SerialSampler, obs_to_torch
from rl.storage import RolloutStorage
from rl.tasks import Actions, dict_space

SMALL_NAV = {"_target_": "rl.tasks.PointNavEnv", "size": 9, "rooms_per_side": 2, "max_steps": 20}


def _random_obs(space: gym.spaces.Dict, lead: tuple[int, ...], seed: int = 0):
    space.seed(seed)
    samples = [space.sample() for _ in range(int(np.prod(lead)))]
    return {
        k: torch.as_tensor(np.stack([np.asarray(s[k]) for s in samples])).reshape(
            *lead, *np.asarray(samples[0][k]).shape
        )
        for k in space.spaces
    }


IMAGE_VECTOR = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(0, 255, (7, 7, 3), dtype=np.uint8),
        "goal": gym.spaces.Box(-np.inf, np.inf, (3,), dtype=np.float32),
    }
)


# A categorical grid whose channels take the values 0..10, 0..5 and 0..2 (minigrid's).
NAV_IMAGE = gym.spaces.Dict(
    {
        "image": gym.spaces.Box(
            0, np.broadcast_to(np.array([10, 5, 2], dtype=np.uint8), (7, 7, 3)), dtype=np.uint8
        ),
        "goal": gym.spaces.Box(-np.inf, np.inf, (3,), dtype=np.float32),
    }
)


def test_onehot_encoding_is_one_hot_per_channel_value() -> None:
    model = ActorCritic(
        observation_space=NAV_IMAGE,
        action_space=gym.spaces.Discrete(4),
        image_encoding="onehot",
        cnn_channels=[4],
    )
    encoder = model.encoders["image"]
    assert encoder.onehot_size == 11 + 6 + 3
    conv = encoder.convs[0]
    image = torch.tensor([[[[3, 5, 2]]]], dtype=torch.uint8).expand(1, 7, 7, 3).contiguous()
    seen = {}
    conv.register_forward_hook(lambda _m, inputs, _out: seen.update(x=inputs[0]))
    encoder(image)
    expected = torch.zeros(20)
    expected[[3, 11 + 5, 17 + 2]] = 1.0
    assert torch.equal(seen["x"][0, :, 0, 0], expected)


def test_onehot_needs_small_declared_values() -> None:
    with pytest.raises(ValueError, match="declare each channel's real maximum"):
        ActorCritic(
            observation_space=IMAGE_VECTOR,  # high 255: 768 one-hot channels
            action_space=gym.spaces.Discrete(4),
            image_encoding="onehot",
        )


@pytest.mark.parametrize(
    ("space", "kwargs"),
    [
        pytest.param(IMAGE_VECTOR, {"image_encoding": "embed"}, id="image-embed+vector"),
        pytest.param(IMAGE_VECTOR, {"image_encoding": "scale"}, id="image-scale+vector"),
        pytest.param(NAV_IMAGE, {"image_encoding": "onehot"}, id="image-onehot+vector"),
        pytest.param(IMAGE_VECTOR, {"cnn_channels": []}, id="image-flattened+vector"),
        pytest.param(dict_space(gym.spaces.Box(-1, 1, (4,), dtype=np.float32)), {}, id="vector"),
        pytest.param(
            gym.spaces.Dict(
                {
                    "pos": gym.spaces.Discrete(5),
                    "v": gym.spaces.Box(-1, 1, (2,), dtype=np.float32),
                }
            ),
            {},
            id="discrete+vector",
        ),
    ],
)
@pytest.mark.parametrize("rnn", [None, "gru"])
def test_output_shapes(space: gym.spaces.Dict, kwargs: dict, rnn: str | None) -> None:
    t, n, a = 3, 5, 4
    model = ActorCritic(
        observation_space=space,
        action_space=gym.spaces.Discrete(a),
        rnn=rnn,
        rnn_hidden_size=16,
        trunk_layers=[32],
        **kwargs,
    )
    obs = _random_obs(space, (t, n))
    starts = torch.zeros(t, n, dtype=torch.bool)
    out, hidden = model(obs, starts, model.initial_hidden(n))
    assert out.logits.shape == (t, n, a)
    assert out.values.shape == (t, n)
    assert hidden.shape == (*model.hidden_shape[:1], n, model.hidden_shape[1])
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.values).all()
    actions, logprobs, values, logits, _ = model.act(
        {k: v[0] for k, v in obs.items()}, starts[0], model.initial_hidden(n)
    )
    assert actions.shape == logprobs.shape == values.shape == (n,)
    assert logits.shape == (n, a)


def test_vector_space_is_wrapped_by_dict_space() -> None:
    box = gym.spaces.Box(-1, 1, (4,), dtype=np.float32)
    assert list(dict_space(box).spaces) == ["obs"]
    assert dict_space(IMAGE_VECTOR) is IMAGE_VECTOR


def test_deterministic_act_is_argmax() -> None:
    torch.manual_seed(0)
    model = ActorCritic(
        observation_space=IMAGE_VECTOR, action_space=gym.spaces.Discrete(4), rnn=None
    )
    # Larger output weights so the logits are well separated.
    torch.nn.init.normal_(model.actor_out.weight, std=1.0)
    obs = _random_obs(IMAGE_VECTOR, (16,))
    actions, logprobs, _, logits, _ = model.act(
        obs, torch.zeros(16, dtype=torch.bool), model.initial_hidden(16), deterministic=True
    )
    torch.testing.assert_close(actions, logits.argmax(-1))
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1).max(-1).values)


# ------------------------------------------------------- recurrent re-evaluation
T_ROLLOUT, N_ENVS = 32, 8


@pytest.fixture(scope="module")
def gru_rollout():
    """A GRU policy and a T=32 rollout of 8 small-nav envs, collected as the trainer does."""
    torch.manual_seed(0)
    sampler = SerialSampler(task=SMALL_NAV, num_envs=N_ENVS, seed=3)
    try:
        model = ActorCritic(
            observation_space=sampler.observation_space,
            action_space=sampler.action_space,
            rnn="gru",
            rnn_hidden_size=32,
            cnn_channels=[16],
            trunk_layers=[32],
        )
        # Bigger output weights than the 0.01 init so the log-probs really depend on the input.
        torch.nn.init.normal_(model.actor_out.weight, std=0.1)
        with torch.no_grad():  # rarely STOP, so some episodes run into the time limit
            model.actor_out.bias[Actions.STOP] = -2.0
        model.eval()
        space = sampler.observation_space
        storage = RolloutStorage(
            num_steps=T_ROLLOUT,
            num_envs=N_ENVS,
            obs_shapes={k: s.shape for k, s in space.spaces.items()},
            obs_dtypes={
                k: torch.from_numpy(np.zeros((), dtype=s.dtype)).dtype
                for k, s in space.spaces.items()
            },
            hidden_shape=model.hidden_shape,
        )
        obs_np, expert_np = sampler.reset()
        obs = obs_to_torch(obs_np, torch.device("cpu"))
        expert = torch.from_numpy(expert_np)
        episode_starts = torch.ones(N_ENVS, dtype=torch.bool)
        # Start mid-way: a non-zero state that the storage must hand back to the update.
        hidden = torch.randn(model.hidden_shape[0], N_ENVS, model.hidden_shape[1])
        episode_starts[::2] = False
        storage.reset(T_ROLLOUT)
        storage.set_first(obs, episode_starts, hidden)
        zeros = torch.zeros(N_ENVS)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for _ in range(T_ROLLOUT):
                hidden_before = hidden
                actions, logprobs, values, _, hidden = model.act(
                    obs, episode_starts, hidden, generator=gen
                )
                result = sampler.step(actions.numpy())
                next_obs = obs_to_torch(result.obs, torch.device("cpu"))
                truncation_values = zeros
                if len(result.final_obs_indices):
                    idx = torch.from_numpy(result.final_obs_indices)
                    final = obs_to_torch(result.final_obs, torch.device("cpu"))
                    out, _ = model(
                        {k: v.unsqueeze(0) for k, v in final.items()},
                        torch.zeros(1, len(idx), dtype=torch.bool),
                        hidden[:, idx],
                    )
                    truncation_values = zeros.clone()
                    truncation_values[idx] = out.values[0]
                terminated = torch.from_numpy(result.terminated)
                truncated = torch.from_numpy(result.truncated)
                storage.insert(
                    next_obs=next_obs,
                    actions=actions,
                    logprobs=logprobs,
                    values=values,
                    rewards=torch.from_numpy(result.rewards),
                    terminated=terminated,
                    truncated=truncated,
                    truncation_values=truncation_values,
                    expert_actions=expert,
                    hidden=hidden_before,
                )
                expert = torch.from_numpy(result.expert_actions)
                obs, episode_starts = next_obs, terminated | truncated
    finally:
        sampler.close()
    return model, storage


def test_rollout_has_episode_starts_inside(gru_rollout) -> None:
    _, storage = gru_rollout
    starts = storage.episode_starts[1:T_ROLLOUT]
    assert starts.any(dim=0).all(), "every env should start a new episode inside the rollout"
    assert storage.truncated.any()
    assert not storage.hidden.eq(0).all()


def test_minibatch_reevaluation_reproduces_rollout(gru_rollout) -> None:
    model, storage = gru_rollout
    g = torch.Generator().manual_seed(1)
    seen = 0
    max_diff = 0.0
    wrong_hidden_diff = 0.0
    with torch.no_grad():
        for batch in storage.minibatches(4, generator=g):
            out, _ = model(batch.obs, batch.episode_starts, batch.hidden)
            logprobs = D.log_prob(out.logits, batch.actions)
            max_diff = max(max_diff, (logprobs - batch.old_logprobs).abs().max().item())
            torch.testing.assert_close(logprobs, batch.old_logprobs, atol=1e-6, rtol=0)
            torch.testing.assert_close(out.values, batch.old_values, atol=1e-6, rtol=0)
            seen += batch.actions.shape[1]
            # Control: the comparison is sensitive enough to notice a wrong initial state.
            wrong, _ = model(batch.obs, batch.episode_starts, torch.zeros_like(batch.hidden))
            wrong_lp = D.log_prob(wrong.logits, batch.actions)
            wrong_hidden_diff = max(wrong_hidden_diff, (wrong_lp - logprobs).abs().max().item())
    assert seen == N_ENVS
    assert storage.logprobs.std() > 0.05  # the policy is far from uniform/constant
    assert wrong_hidden_diff > 1e-3
    print(f"max |log-prob difference| over the rollout: {max_diff:.3e}")


def test_hidden_state_is_reset_at_episode_starts(gru_rollout) -> None:
    model, storage = gru_rollout
    batch = storage.batch(torch.arange(N_ENVS))
    with torch.no_grad():
        out, _ = model(batch.obs, batch.episode_starts, batch.hidden)
        no_resets, _ = model(batch.obs, torch.zeros_like(batch.episode_starts), batch.hidden)
    for env in range(N_ENVS):
        later_starts = batch.episode_starts[1:, env].nonzero().flatten() + 1
        first = int(later_starts[0])
        # Before the first reset inside the rollout nothing differs (unless obs[0] starts one).
        if not batch.episode_starts[0, env]:
            torch.testing.assert_close(out.logits[:first, env], no_resets.logits[:first, env])
        # From the first reset on, ignoring the mask changes the outputs.
        assert not torch.allclose(out.logits[first, env], no_resets.logits[first, env])
        # And the state really is zero there: one step from a zero state on that obs matches.
        step, _ = model(
            {k: v[first : first + 1, env : env + 1] for k, v in batch.obs.items()},
            torch.zeros(1, 1, dtype=torch.bool),
            model.initial_hidden(1),
        )
        torch.testing.assert_close(step.logits[0, 0], out.logits[first, env])


@pytest.mark.parametrize("rnn", [None, "gru"])
def test_discrete_only_observation(rnn: str | None) -> None:
    space = dict_space(gym.spaces.Discrete(6))  # e.g. FrozenLake / Taxi through a sampler
    model = ActorCritic(
        observation_space=space,
        action_space=gym.spaces.Discrete(3),
        rnn=rnn,
        rnn_hidden_size=8,
        trunk_layers=[16],
    )
    obs = {"obs": torch.tensor([[0, 5], [3, 1]])}
    out, _ = model(obs, torch.zeros(2, 2, dtype=torch.bool), model.initial_hidden(2))
    assert out.logits.shape == (2, 2, 3)
    # One-hot input: the same state gives the same output wherever it occurs.
    same, _ = model(
        {"obs": torch.tensor([[5]])}, torch.zeros(1, 1, dtype=torch.bool), model.initial_hidden(1)
    )
    torch.testing.assert_close(same.logits[0, 0], out.logits[0, 1])


@pytest.mark.parametrize("recurrence", [8, 5])
def test_chunked_bptt_starts_each_chunk_from_the_stored_state(gru_rollout, recurrence) -> None:
    """Truncated BPTT: every chunk re-runs from the state the rollout policy held there.

    ``recurrence=5`` does not divide the 32-step rollout: chunks of 4 (the longest that does).
    """
    model, storage = gru_rollout
    length = storage.sequence_length(recurrence)
    assert length == (8 if recurrence == 8 else 4)
    g = torch.Generator().manual_seed(2)
    seen: list[tuple[int, int]] = []
    wrong_hidden_diff = 0.0
    with torch.no_grad():
        for batch in storage.minibatches(6, generator=g, recurrence=recurrence):
            assert batch.actions.shape[0] == length
            # Which (start step, env) each sequence is: the stored actions identify it.
            for j in range(batch.actions.shape[1]):
                matches = [
                    (t0, env)
                    for t0 in range(0, T_ROLLOUT, length)
                    for env in range(N_ENVS)
                    if torch.equal(storage.actions[t0 : t0 + length, env], batch.actions[:, j])
                    and torch.equal(
                        storage.logprobs[t0 : t0 + length, env], batch.old_logprobs[:, j]
                    )
                ]
                assert len(matches) == 1
                t0, env = matches[0]
                seen.append(matches[0])
                assert torch.equal(batch.hidden[:, j], storage.hiddens[t0, :, env])
                assert torch.equal(
                    batch.episode_starts[:, j], storage.episode_starts[t0 : t0 + length, env]
                )
            out, _ = model(batch.obs, batch.episode_starts, batch.hidden)
            logprobs = D.log_prob(out.logits, batch.actions)
            torch.testing.assert_close(logprobs, batch.old_logprobs, atol=1e-6, rtol=0)
            torch.testing.assert_close(out.values, batch.old_values, atol=1e-6, rtol=0)
            wrong, _ = model(batch.obs, batch.episode_starts, torch.zeros_like(batch.hidden))
            wrong_lp = D.log_prob(wrong.logits, batch.actions)
            wrong_hidden_diff = max(wrong_hidden_diff, (wrong_lp - logprobs).abs().max().item())
    # Every chunk of every environment exactly once per epoch.
    assert sorted(seen) == [(t0, e) for t0 in range(0, T_ROLLOUT, length) for e in range(N_ENVS)]
    assert wrong_hidden_diff > 1e-3  # the stored states matter: zeros give other log-probs
