"""ActorCritic over different observation spaces, and recurrent re-evaluation of a real rollout."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from small import final_obs_of, obs_of
from tensordict import TensorDict

from rl.models import ActorCritic, policy_input
from rl.sampling import SerialSampler
from rl.storage import RolloutStorage, sequence_start_state
from rl.tasks import dict_space
from rl_envs.pointnav import Actions

SMALL_NAV = {
    "_target_": "rl_envs.pointnav.PointNavEnv",
    "size": 9,
    "rooms_per_side": 2,
    "max_steps": 20,
}


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
@pytest.mark.parametrize("rnn", [None, "gru", "lstm"])
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
    out, state = model(obs, starts, model.initial_state(n, "cpu"))
    assert out.dist.logits.shape == (t, n, a)
    assert out.values.shape == (t, n)
    assert state.batch_size == (n,)
    names = {None: set(), "gru": {"h"}, "lstm": {"h", "c"}}[rnn]
    assert set(state.keys()) == names
    assert all(v.shape == (n, 1, 16) for v in state.values())
    assert torch.isfinite(out.dist.logits).all() and torch.isfinite(out.values).all()
    step = model.act(
        policy_input({k: v[0] for k, v in obs.items()}, starts[0], model.initial_state(n, "cpu"))
    )
    assert step["actions"].shape == step["logprobs"].shape == step["values"].shape == (n,)
    assert step["next_state"].batch_size == (n,)


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
    starts, state = torch.zeros(16, dtype=torch.bool), model.initial_state(16, "cpu")
    step = model.act(policy_input(obs, starts, state), deterministic=True)
    logits = model({k: v[None] for k, v in obs.items()}, starts[None], state)[0].dist.logits[0]
    torch.testing.assert_close(step["actions"], logits.argmax(-1))
    torch.testing.assert_close(step["logprobs"], torch.log_softmax(logits, -1).max(-1).values)


# ------------------------------------------------------- recurrent re-evaluation
T_ROLLOUT, N_ENVS = 32, 8


@pytest.fixture(scope="module", params=["gru", "lstm"])
def recurrent_rollout(request):
    """A GRU or LSTM policy and a T=32 rollout of 8 small-nav envs, collected as the trainer
    does."""
    torch.manual_seed(0)
    sampler = SerialSampler(task=SMALL_NAV, num_envs=N_ENVS, seed=3)
    try:
        model = ActorCritic(
            observation_space=sampler.observation_space,
            action_space=sampler.action_space,
            rnn=request.param,
            rnn_hidden_size=32,
            cnn_channels=[16],
            trunk_layers=[32],
        )
        # Bigger output weights than the 0.01 init so the log-probs really depend on the input.
        torch.nn.init.normal_(model.actor_out.weight, std=0.1)
        with torch.no_grad():  # rarely STOP, so some episodes run into the time limit
            model.actor_out.bias[Actions.STOP] = -2.0
        model.eval()
        storage = RolloutStorage(num_steps=T_ROLLOUT, num_envs=N_ENVS, device="cpu")
        first = sampler.reset()
        obs, expert = obs_of(first), first["expert_actions"]
        episode_starts = torch.ones(N_ENVS, dtype=torch.bool)
        # Start mid-way: a non-zero state that the storage must hand back to the update.
        state = model.initial_state(N_ENVS, "cpu").apply(torch.randn_like)
        episode_starts[::2] = False
        storage.reset(T_ROLLOUT)
        storage.set_first(obs, episode_starts, state)
        zeros = torch.zeros(N_ENVS)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for _ in range(T_ROLLOUT):
                step = model.act(policy_input(obs, episode_starts, state), generator=gen)
                state = step["next_state"]
                result = sampler.step(step["actions"].numpy())
                next_obs = obs_of(result)
                truncation_values = zeros
                final, idx = final_obs_of(result)
                if len(idx):
                    out, _ = model(
                        {k: v.unsqueeze(0) for k, v in final.items()},
                        torch.zeros(1, len(idx), dtype=torch.bool),
                        state[idx],
                    )
                    truncation_values = zeros.clone()
                    truncation_values[idx] = out.values[0]
                terminated, truncated = result["terminated"], result["truncated"]
                fields = {
                    "actions": step["actions"],
                    "logprobs": step["logprobs"],
                    "values": step["values"],
                    "rewards": result["rewards"],
                    "terminated": terminated,
                    "truncated": truncated,
                    "truncation_values": truncation_values,
                    "expert_actions": expert,
                }
                storage.insert(fields, next_obs, state)
                expert = result["expert_actions"]
                obs, episode_starts = next_obs, terminated | truncated
    finally:
        sampler.close()
    return model, storage


def _zeros_like(state: TensorDict) -> TensorDict:
    return state.apply(torch.zeros_like)


def test_rollout_has_episode_starts_inside(recurrent_rollout) -> None:
    _, storage = recurrent_rollout
    starts = storage["episode_starts"][1:T_ROLLOUT]
    assert starts.any(dim=0).all(), "every env should start a new episode inside the rollout"
    assert storage["truncated"][:T_ROLLOUT].any()
    assert not storage["state", "h"][0].eq(0).all()


def test_minibatch_reevaluation_reproduces_rollout(recurrent_rollout) -> None:
    model, storage = recurrent_rollout
    g = torch.Generator().manual_seed(1)
    seen = 0
    max_diff = 0.0
    wrong_state_diff = 0.0
    with torch.no_grad():
        for batch in storage.minibatches(4, generator=g):
            start = sequence_start_state(batch)
            out, _ = model(batch["obs"], batch["episode_starts"], start)
            logprobs = out.dist.log_prob(batch["actions"])
            max_diff = max(max_diff, (logprobs - batch["logprobs"]).abs().max().item())
            torch.testing.assert_close(logprobs, batch["logprobs"], atol=1e-6, rtol=0)
            torch.testing.assert_close(out.values, batch["values"], atol=1e-6, rtol=0)
            seen += batch["actions"].shape[1]
            # Control: the comparison is sensitive enough to notice a wrong initial state.
            wrong, _ = model(batch["obs"], batch["episode_starts"], _zeros_like(start))
            wrong_lp = wrong.dist.log_prob(batch["actions"])
            wrong_state_diff = max(wrong_state_diff, (wrong_lp - logprobs).abs().max().item())
    assert seen == N_ENVS
    assert storage["logprobs"][:T_ROLLOUT].std() > 0.05  # far from uniform/constant
    assert wrong_state_diff > 1e-3
    print(f"max |log-prob difference| over the rollout: {max_diff:.3e}")


def test_state_is_reset_at_episode_starts(recurrent_rollout) -> None:
    model, storage = recurrent_rollout
    batch = storage.batch(torch.arange(N_ENVS))
    starts, start = batch["episode_starts"], sequence_start_state(batch)
    with torch.no_grad():
        out, _ = model(batch["obs"], starts, start)
        no_resets, _ = model(batch["obs"], torch.zeros_like(starts), start)
    logits, no_reset_logits = out.dist.logits, no_resets.dist.logits
    for env in range(N_ENVS):
        later_starts = starts[1:, env].nonzero().flatten() + 1
        first = int(later_starts[0])
        # Before the first reset inside the rollout nothing differs (unless obs[0] starts one).
        if not starts[0, env]:
            torch.testing.assert_close(logits[:first, env], no_reset_logits[:first, env])
        # From the first reset on, ignoring the mask changes the outputs.
        assert not torch.allclose(logits[first, env], no_reset_logits[first, env])
        # And the state really is zero there: one step from a zero state on that obs matches.
        step, _ = model(
            {k: v[first : first + 1, env : env + 1] for k, v in batch["obs"].items()},
            torch.zeros(1, 1, dtype=torch.bool),
            model.initial_state(1, "cpu"),
        )
        torch.testing.assert_close(step.dist.logits[0, 0], logits[first, env])


@pytest.mark.parametrize("rnn", [None, "gru", "lstm"])
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
    out, _ = model(obs, torch.zeros(2, 2, dtype=torch.bool), model.initial_state(2, "cpu"))
    assert out.dist.logits.shape == (2, 2, 3)
    # One-hot input: the same state gives the same output wherever it occurs.
    same, _ = model(
        {"obs": torch.tensor([[5]])},
        torch.zeros(1, 1, dtype=torch.bool),
        model.initial_state(1, "cpu"),
    )
    torch.testing.assert_close(same.dist.logits[0, 0], out.dist.logits[0, 1])


@pytest.mark.parametrize("recurrence", [8, 5])
def test_chunked_bptt_starts_each_chunk_from_the_stored_state(
    recurrent_rollout, recurrence
) -> None:
    """Truncated BPTT: every chunk re-runs from the state the rollout policy held there.

    ``recurrence=5`` does not divide the 32-step rollout: chunks of 4 (the longest that does).
    """
    model, storage = recurrent_rollout
    length = storage.sequence_length(recurrence)
    assert length == (8 if recurrence == 8 else 4)
    g = torch.Generator().manual_seed(2)
    seen: list[tuple[int, int]] = []
    wrong_state_diff = 0.0
    actions, logprobs_all = storage["actions"], storage["logprobs"]
    with torch.no_grad():
        for batch in storage.minibatches(6, generator=g, recurrence=recurrence):
            assert batch["actions"].shape[0] == length
            start = sequence_start_state(batch)
            # Which (start step, env) each sequence is: the stored actions identify it.
            for j in range(batch["actions"].shape[1]):
                matches = [
                    (t0, env)
                    for t0 in range(0, T_ROLLOUT, length)
                    for env in range(N_ENVS)
                    if torch.equal(actions[t0 : t0 + length, env], batch["actions"][:, j])
                    and torch.equal(logprobs_all[t0 : t0 + length, env], batch["logprobs"][:, j])
                ]
                assert len(matches) == 1
                t0, env = matches[0]
                seen.append(matches[0])
                for key in start.keys():
                    assert torch.equal(start[key][j], storage["state", key][t0, env])
                assert torch.equal(
                    batch["episode_starts"][:, j], storage["episode_starts"][t0 : t0 + length, env]
                )
            out, _ = model(batch["obs"], batch["episode_starts"], start)
            logprobs = out.dist.log_prob(batch["actions"])
            torch.testing.assert_close(logprobs, batch["logprobs"], atol=1e-6, rtol=0)
            torch.testing.assert_close(out.values, batch["values"], atol=1e-6, rtol=0)
            wrong, _ = model(batch["obs"], batch["episode_starts"], _zeros_like(start))
            wrong_lp = wrong.dist.log_prob(batch["actions"])
            wrong_state_diff = max(wrong_state_diff, (wrong_lp - logprobs).abs().max().item())
    # Every chunk of every environment exactly once per epoch.
    assert sorted(seen) == [(t0, e) for t0 in range(0, T_ROLLOUT, length) for e in range(N_ENVS)]
    assert wrong_state_diff > 1e-3  # the stored states matter: zeros give other log-probs
