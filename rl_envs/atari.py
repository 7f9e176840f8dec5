"""Atari 2600 games (ale-py) with CleanRL's PPO preprocessing, per environment and batched.

``conf/task/atari.yaml`` points here: ``task=atari task.game=pong``. Two forms of one task:

- :func:`make_atari_env`: one gymnasium environment, ``ALE/<Game>-v5`` with ``frameskip=1``
  under the wrappers of CleanRL's ``ppo_atari.py`` (``cleanrl_utils/atari_wrappers.py``):
  no-op starts, frame skip with a max over the last two frames, 84x84 grayscale, episodic
  life, FIRE on reset, rewards clipped to their sign, 4 frames stacked. The serial and
  multiprocess samplers step it, and evaluation does (:mod:`rl.collection.episodes`).
- :func:`make_atari_batched_env`, named by ``make_atari_env.batched_env``: ``num_envs`` games
  stepped by ale-py's C++ threads (``ale_py.vector_env.AtariVectorEnv``, the same
  preprocessing in C++), through :class:`AtariGames` and
  :class:`~rl.tasks.gym_vector.GymVectorEnv`. ``sampler=batched`` steps it.

Both give ``obs``: uint8 ``[84, 84, 4]`` (the frame stack as channels, oldest first, as the
image encoder reads ``[H, W, C]``; ``[84, 84, 12]`` in colour), a ``Discrete`` action (the
game's minimal action set), and rewards clipped to ``{-1, 0, 1}``. With ``episodic_life`` an
engine episode is one life (terminated when a life is lost, the game going on), so
``charts/episodic_return`` is a life's clipped return; the game's own score comes as the
episode metrics ``game_return`` (the unclipped score of the whole game) and ``game_length``
(its frames, ALE's episode frame number) in the step where the game ends, logged as
``charts/game_return`` and ``charts/game_length``: what CleanRL logs as
``charts/episodic_return`` (``RecordEpisodeStatistics`` inside ``EpisodicLifeEnv``).

Where the two forms differ (ale-py's vector environment cannot step one game alone):

============================ =============================== ===============================
                             per environment (CleanRL)       batched (ale-py's C++)
============================ =============================== ===============================
no-op start                  1..30 no-op frames               0..29 frames, FIRE one of them
FIRE on a new game           FIRE, then action 2 (2 steps)    one FIRE frame
after a lost life            a no-op step, FIRE, action 2     the agent's next action is FIRE
frame stack at a reset       zeros, then the first frame      the same
============================ =============================== ===============================

ale-py's own ``episodic_life`` option resets the whole game when a life is lost (every life
the first one); :class:`AtariGames` asks for no life handling and ends a life itself, as
``EpisodicLifeEnv`` does. Frames are resized as OpenCV's ``INTER_AREA`` does (ale-py's C++
calls it), in NumPy (:class:`AreaResize`: within one grey level of it), so that the per-env
form needs no OpenCV.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from ale_py import Action
from ale_py.env import AtariEnv
from ale_py.vector_env import AtariVectorEnv
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.wrappers import FrameStackObservation

from rl.tasks.gym_vector import GymVectorEnv

__all__ = [
    "AreaResize",
    "AtariFrames",
    "AtariGame",
    "AtariGames",
    "ClipRewardEnv",
    "EpisodicLifeEnv",
    "FireResetEnv",
    "GameStatistics",
    "make_atari_batched_env",
    "make_atari_env",
]

NOOP, FIRE = 0, 1  # indices in every game's minimal action set that has them


def rom_name(game: str) -> str:
    """ale-py's ROM name of ``game``: ``breakout``, ``ms_pacman`` (``MsPacman`` accepted).

    Raises:
        ValueError: No such ROM (naming ``task.game``).
    """
    from ale_py import roms

    name = re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower() if game != game.lower() else game
    if name not in roms.get_all_rom_ids():
        raise ValueError(
            f"task.game={game!r}: not an Atari ROM of ale-py (snake_case ROM names such as "
            "breakout, pong, ms_pacman, space_invaders: ale_py.roms.get_all_rom_ids())"
        )
    return name


def gym_id(game: str) -> str:
    """Gymnasium's id of a game: ``breakout`` -> ``ALE/Breakout-v5``."""
    return "ALE/" + "".join(part.capitalize() for part in rom_name(game).split("_")) + "-v5"


# ---------------------------------------------------------------------- per environment
class AtariGame(AtariEnv):
    """ale-py's ``AtariEnv`` (what ``ALE/<Game>-v5`` builds), saying when a reset goes on.

    With episodic life a reset after a lost life continues the game, which a replay from the
    episode's seed cannot reproduce: :meth:`reset_state` says so, and restoring such an
    episode raises ``NotImplementedError`` (a resumed run starts fresh games, with a
    warning) instead of replaying it wrongly (:mod:`rl.tasks.env_state`).
    """

    _game_ended = True  # no game yet: the next reset starts one

    def step(self, action: Any) -> Any:
        """Step; remember whether the game ended (over or out of frames)."""
        out = super().step(action)
        self._game_ended = bool(out[2] or out[3])
        return out

    def reset(self, **kwargs: Any) -> Any:
        """Start a new game."""
        self._game_ended = False
        return super().reset(**kwargs)

    def reset_state(self) -> dict[str, Any] | None:
        """None where the next reset starts a game, else that it goes on with this one."""
        return None if self._game_ended else {"game_goes_on": True}

    def set_reset_state(self, state: dict[str, Any]) -> None:
        """Refuse to replay an episode that started in the middle of a game."""
        raise NotImplementedError(
            "an Atari episode that started after a lost life (episodic_life) cannot be "
            "replayed from its seed"
        )


class GameStatistics(gym.Wrapper):
    """The whole game's unclipped score and frames, reported in the step where it ends.

    The innermost wrapper (CleanRL's ``RecordEpisodeStatistics`` place): every frame's reward
    is counted, those of no-op starts and FIRE resets included. ``info["episode_metrics"]``
    gets ``game_return`` and ``game_length`` (ALE's episode frame number) when the game is
    over or out of frames.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._score = 0.0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Start a game (its score from 0)."""
        self._score = 0.0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step one frame; at the game's end its score and length in ``episode_metrics``."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._score += float(reward)
        if terminated or truncated:
            metrics = {"game_return": self._score, "game_length": info["episode_frame_number"]}
            info = {**info, "episode_metrics": metrics}
        return obs, reward, terminated, truncated, info


class AreaResize:
    """Shrink ``[H, W]`` (or ``[H, W, C]``) uint8 frames as OpenCV's ``INTER_AREA`` does.

    Each output pixel is the mean of the input area it covers (fractional pixels weighted by
    their overlap), computed as a few weighted sums of gathered rows, then columns (no BLAS
    call: its threads cost more than the sums on a busy machine). Within one grey level of
    OpenCV's (ties round apart), a few pixels of a frame.
    """

    def __init__(self, size: tuple[int, int], out: tuple[int, int]) -> None:
        self._rows = _area_taps(size[0], out[0])
        self._cols = _area_taps(size[1], out[1])

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        """The resized frame (uint8)."""
        x = frame.astype(np.float32)
        extra = (1,) * (x.ndim - 2)  # (a colour channel)
        index, weight = self._rows
        y = sum(w.reshape(-1, 1, *extra) * x[i] for i, w in zip(index, weight, strict=True))
        index, weight = self._cols
        z = sum(w.reshape(1, -1, *extra) * y[:, i] for i, w in zip(index, weight, strict=True))
        return np.rint(z).astype(np.uint8)


def _area_taps(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """Input pixel ``index[t, i]`` has share ``weight[t, i]`` of output pixel ``i``'s area."""
    scale = size / out
    edges = np.arange(out + 1) * scale
    left, right = edges[:-1, None], edges[1:, None]
    pixels = np.arange(size)[None, :]
    overlap = np.clip(np.minimum(right, pixels + 1) - np.maximum(left, pixels), 0.0, None)
    taps = int((overlap > 0).sum(1).max())
    first = np.floor(edges[:-1]).astype(np.int64)
    index = np.minimum(first[None, :] + np.arange(taps)[:, None], size - 1)  # [taps, out]
    weight = np.take_along_axis(overlap, index.T, axis=1).T / scale
    weight[first[None, :] + np.arange(taps)[:, None] >= size] = 0.0  # (past the edge)
    return index, weight.astype(np.float32)


class AtariFrames(gym.Wrapper):
    """Gymnasium's ``AtariPreprocessing`` without OpenCV (it cannot be built without it).

    No-op starts (1 to ``noop_max`` no-op frames drawn from the environment's
    ``np_random``), ``frame_skip`` frames per step with the reward summed and the last two
    frames max-pooled, ALE's grayscale (or RGB) screen resized to ``screen_size`` square
    with :class:`AreaResize`. CleanRL's ``NoopResetEnv``, ``MaxAndSkipEnv``,
    ``ResizeObservation`` and ``GrayScaleObservation`` in one.
    """

    def __init__(
        self,
        env: gym.Env,
        *,
        noop_max: int = 30,
        frame_skip: int = 4,
        screen_size: int = 84,
        grayscale: bool = True,
        max_pool: bool = True,
    ) -> None:
        super().__init__(env)
        if frame_skip < 1 or noop_max < 0 or screen_size < 1:
            raise ValueError(
                f"task: frame_skip >= 1, noop_max >= 0 and screen_size >= 1 expected, got "
                f"{frame_skip}, {noop_max}, {screen_size}"
            )
        self.noop_max, self.frame_skip = noop_max, frame_skip
        self.grayscale, self.max_pool = grayscale, max_pool
        self.ale = env.unwrapped.ale  # type: ignore[attr-defined]
        height, width = self.ale.getScreenDims()
        channels = () if grayscale else (3,)
        self._frames = np.zeros((2, height, width, *channels), dtype=np.uint8)
        self._resize = AreaResize((height, width), (screen_size, screen_size))
        self.observation_space = gym.spaces.Box(
            0, 255, (screen_size, screen_size, *channels), np.uint8
        )

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset, then 1..``noop_max`` no-op frames."""
        _, info = self.env.reset(**kwargs)
        noops = int(self.np_random.integers(1, self.noop_max + 1)) if self.noop_max else 0
        for _ in range(noops):
            _, _, terminated, truncated, info = self.env.step(NOOP)
            if terminated or truncated:
                _, info = self.env.reset(**kwargs)
        self._grab(0)
        self._frames[1] = 0
        return self._observe(), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """``frame_skip`` frames of ``action``; the max of the last two frames."""
        total = 0.0
        terminated = truncated = False
        info: dict[str, Any] = {}
        for t in range(self.frame_skip):
            _, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
            if t == self.frame_skip - 2:
                self._grab(1)
            elif t == self.frame_skip - 1:
                self._grab(0)
        return self._observe(), total, terminated, truncated, info

    def _grab(self, slot: int) -> None:
        if self.grayscale:
            self.ale.getScreenGrayscale(self._frames[slot])
        else:
            self.ale.getScreenRGB(self._frames[slot])

    def _observe(self) -> np.ndarray:
        frame = self._frames[0]
        if self.max_pool and self.frame_skip > 1:
            frame = np.maximum(frame, self._frames[1])
        return self._resize(frame)


class EpisodicLifeEnv(gym.Wrapper):
    """A lost life ends the episode; the game goes on (CleanRL's ``EpisodicLifeEnv``).

    A reset after a lost life takes a no-op step instead of starting a new game (and starts
    one only if that step ends the game).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.was_real_done = True

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Step; terminated also where a life was lost (and lives remain)."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """A new game after a real end, else a no-op step of this one."""
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(NOOP)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        return obs, info


class FireResetEnv(gym.Wrapper):
    """FIRE, then action 2, after every reset (CleanRL's ``FireResetEnv``).

    For games that wait for FIRE to start (Breakout's ball); applied only to games whose
    minimal action set has FIRE.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
        if meanings[FIRE] != "FIRE" or len(meanings) < 3:
            raise ValueError(f"FireResetEnv: FIRE is not action 1 of {meanings}")

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Reset, then FIRE and action 2 (a new reset where either ends the game)."""
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(FIRE)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class ClipRewardEnv(gym.RewardWrapper):
    """Rewards clipped to their sign, ``{-1, 0, 1}`` (CleanRL's ``ClipRewardEnv``)."""

    def reward(self, reward: Any) -> float:
        """The reward's sign."""
        return float(np.sign(float(reward)))


class _ChannelsLast(gym.ObservationWrapper):
    """The frame stack ``[stack, H, W(, C)]`` as ``[H, W, stack (* C)]``, oldest first."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        stack, height, width, *channels = env.observation_space.shape  # type: ignore[misc]
        depth = stack * (channels[0] if channels else 1)
        self.observation_space = gym.spaces.Box(0, 255, (height, width, depth), np.uint8)

    def observation(self, observation: Any) -> np.ndarray:
        """Channels last."""
        return _channels_last(np.asarray(observation)[None])[0]


def make_atari_env(
    *,
    game: str = "breakout",
    noop_max: int = 30,
    frame_skip: int = 4,
    max_pool: bool = True,
    screen_size: int = 84,
    grayscale: bool = True,
    frame_stack: int = 4,
    episodic_life: bool = True,
    fire_reset: bool = True,
    clip_rewards: bool = True,
    repeat_action_probability: float = 0.0,
    full_action_space: bool = False,
    max_episode_frames: int = 108_000,
    num_threads: int = 0,
    render_mode: str | None = None,
) -> gym.Env:
    """One Atari game with CleanRL's ``ppo_atari.py`` wrappers (see the module docstring).

    Args:
        game: ale-py's ROM name (``breakout``, ``pong``, ``ms_pacman``, ...).
        noop_max: At most this many no-op frames start a game (0: none).
        frame_skip: Frames each action is repeated (rewards summed).
        max_pool: The observed frame is the max of the last two of a step (flicker).
        screen_size: Frames resized to this square.
        grayscale: ALE's grayscale screen (else RGB: 3 channels a frame).
        frame_stack: Frames stacked as channels.
        episodic_life: A lost life ends the episode (the game goes on).
        fire_reset: FIRE after each reset, in games that have it.
        clip_rewards: Rewards clipped to their sign.
        repeat_action_probability: Sticky actions (ALE v5's default is 0.25; CleanRL and
            envpool use 0).
        full_action_space: All 18 actions (else the game's minimal set).
        max_episode_frames: A game is truncated after this many frames (108,000: 30 minutes).
        num_threads: The batched twin's C++ threads (0: one per core); unused here.
        render_mode: ``rgb_array`` for videos (the full-size RGB screen).
    """
    del num_threads  # (the batched twin's)
    base = gym.make(
        dataclasses.replace(gym.spec(gym_id(game)), entry_point="rl_envs.atari:AtariGame"),
        frameskip=1,
        repeat_action_probability=repeat_action_probability,
        full_action_space=full_action_space,
        max_num_frames_per_episode=max_episode_frames,
        obs_type="ram",  # (not read: AtariFrames reads the screen; RAM is the cheapest to make)
        render_mode=render_mode,
    )
    env: gym.Env = GameStatistics(base)
    env = AtariFrames(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        grayscale=grayscale,
        max_pool=max_pool,
    )
    if episodic_life:
        env = EpisodicLifeEnv(env)
    if fire_reset and "FIRE" in env.unwrapped.get_action_meanings():  # type: ignore[attr-defined]
        env = FireResetEnv(env)
    if clip_rewards:
        env = ClipRewardEnv(env)
    env = FrameStackObservation(env, frame_stack, padding_type="zero")
    return _ChannelsLast(env)


# --------------------------------------------------------------------------- batched
def _channels_last(stack: np.ndarray) -> np.ndarray:
    """``[N, stack, H, W(, C)]`` -> ``[N, H, W, stack (* C)]`` (a copy; frame by frame, fast)."""
    if stack.ndim == 4:
        return np.stack([stack[:, i] for i in range(stack.shape[1])], axis=-1)
    return np.concatenate([stack[:, i] for i in range(stack.shape[1])], axis=-1)


class AtariGames(VectorEnv):
    """``num_envs`` games of ale-py's ``AtariVectorEnv`` with CleanRL's episodic life.

    ale-py's vector environment does the frames (no-op starts, FIRE on a new game, frame
    skip, max-pool, grayscale, resize, stack) in C++ threads; this class adds what it does
    otherwise (see the module docstring): a lost life ends the episode while the game goes on
    (the vector environment's own ``episodic_life`` would start a new game), the agent's
    first action after it is FIRE, rewards are clipped here (the unclipped ones make the
    game's score), ``game_return`` and ``game_length`` come in ``info["episode_metrics"]``
    where a game ends, and observations are channels last.

    Resets follow gymnasium's ``NEXT_STEP`` mode: the caller resets the environments whose
    episode ended (``reset(options={"reset_mask": done})``, as
    :class:`~rl.tasks.gym_vector.GymVectorEnv` does at once); only those whose game ended
    start a new one (with their seed), the others go on with their game.

    Args: those of :func:`make_atari_batched_env`.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        *,
        game: str,
        num_envs: int,
        noop_max: int = 30,
        frame_skip: int = 4,
        max_pool: bool = True,
        screen_size: int = 84,
        grayscale: bool = True,
        frame_stack: int = 4,
        episodic_life: bool = True,
        fire_reset: bool = True,
        clip_rewards: bool = True,
        repeat_action_probability: float = 0.0,
        full_action_space: bool = False,
        max_episode_frames: int = 108_000,
        num_threads: int = 0,
    ) -> None:
        self.games = AtariVectorEnv(
            rom_name(game),
            num_envs,
            num_threads=num_threads,
            max_num_frames_per_episode=max_episode_frames,
            repeat_action_probability=repeat_action_probability,
            full_action_space=full_action_space,
            autoreset_mode=AutoresetMode.NEXT_STEP,
            img_height=screen_size,
            img_width=screen_size,
            grayscale=grayscale,
            stack_num=frame_stack,
            frameskip=frame_skip,
            maxpool=max_pool,
            noop_max=noop_max,
            episodic_life=False,  # (it would start a new game: ours ends a life, below)
            life_loss_info=False,
            reward_clipping=False,  # (the game's score is the unclipped sum: clipped here)
            use_fire_reset=fire_reset,
        )
        self.num_envs = num_envs
        self.episodic_life, self.clip_rewards = episodic_life, clip_rewards
        actions = list(self.games.ale.get_action_set())
        # The action that is FIRE after a lost life (None: the game has none, or no FIRE)
        self._fire = actions.index(Action.FIRE) if fire_reset and Action.FIRE in actions else None
        self.single_action_space = self.games.single_action_space
        self.action_space = self.games.action_space
        depth = frame_stack * (1 if grayscale else 3)
        self.single_observation_space = gym.spaces.Box(
            0, 255, (screen_size, screen_size, depth), np.uint8
        )
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.spec = gym.spec(gym_id(game))
        self._obs = np.zeros((num_envs, screen_size, screen_size, depth), np.uint8)
        self._score = np.zeros(num_envs)
        self._lives = np.zeros(num_envs, dtype=np.int64)
        self._game_over = np.ones(num_envs, dtype=bool)  # needs a new game at its reset
        self._fire_next = np.zeros(num_envs, dtype=bool)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """New games where ``reset_mask`` (all: None) holds and a game ended; others go on.

        Args:
            seed: One per environment (None: its own random stream), or an int for all
                (``seed + i``); a seed starts a new game only.
            options: ``reset_mask``: bool ``[num_envs]``.
        """
        n = self.num_envs
        mask = None if options is None else options.get("reset_mask")
        rows = np.ones(n, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        seeds = _seed_list(seed, n)
        new = rows & self._game_over if mask is not None else rows
        if new.any():
            chosen = np.array([-1 if s is None else s for s in seeds], dtype=np.int64)[new]
            obs, info = self.games.reset(
                seed=chosen, options=None if new.all() else {"reset_mask": new}
            )
            self._obs[new] = _channels_last(obs)[new]
            self._lives[new] = info["lives"][new]
            self._score[new] = 0.0
            self._game_over[new] = False
            self._fire_next[new] = False
        going_on = rows & ~new
        if self._fire is not None:
            self._fire_next |= going_on  # (a lost life: FIRE starts the next)
        return self._obs.copy(), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every game (see the class docstring)."""
        actions = np.asarray(actions, dtype=np.int64)
        if self._fire_next.any():
            actions = actions.copy()
            actions[self._fire_next] = self._fire
            self._fire_next[:] = False
        obs, raw, game_over, out_of_frames, info = self.games.step(actions)
        raw = np.asarray(raw, dtype=np.float64)
        self._score += raw
        lives = np.asarray(info["lives"], dtype=np.int64)
        ended = np.asarray(game_over, dtype=bool) | np.asarray(out_of_frames, dtype=bool)
        terminated = np.asarray(game_over, dtype=bool).copy()
        if self.episodic_life:
            terminated |= (lives > 0) & (lives < self._lives)
        truncated = np.asarray(out_of_frames, dtype=bool) & ~terminated
        self._lives = lives
        self._game_over = ended
        self._obs = _channels_last(obs)
        rewards = np.sign(raw) if self.clip_rewards else raw
        out: dict[str, Any] = {}
        if ended.any():
            frames = np.asarray(info["episode_frame_number"], dtype=np.float64)
            out["episode_metrics"] = {
                "game_return": self._score.copy(),
                "_game_return": ended.copy(),
                "game_length": frames,
                "_game_length": ended.copy(),
            }
            self._score[ended] = 0.0
        return self._obs, rewards.astype(np.float32), terminated, truncated, out

    def close_extras(self, **kwargs: Any) -> None:
        """Stop ale-py's threads."""
        self.games.close()
        self.games.ale = None  # type: ignore[assignment]  # (its destructor joins the threads)


def _seed_list(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, int | np.integer):
        return [int(seed) + i for i in range(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ValueError(f"{len(seeds)} seeds for {n} environments")
    return [None if s is None else int(s) for s in seeds]


def make_atari_batched_env(
    *,
    num_envs: int,
    device: Any,
    game: str = "breakout",
    noop_max: int = 30,
    frame_skip: int = 4,
    max_pool: bool = True,
    screen_size: int = 84,
    grayscale: bool = True,
    frame_stack: int = 4,
    episodic_life: bool = True,
    fire_reset: bool = True,
    clip_rewards: bool = True,
    repeat_action_probability: float = 0.0,
    full_action_space: bool = False,
    max_episode_frames: int = 108_000,
    num_threads: int = 0,
) -> GymVectorEnv:
    """``num_envs`` games in ale-py's C++ threads, as a batched environment (on the CPU).

    The batched twin of :func:`make_atari_env` (its ``batched_env``): the same task keys,
    plus ``num_envs`` and ``device`` (ignored: ale-py steps on the CPU); ``num_threads`` is
    ale-py's (0: one per environment, at most one per core).
    """
    del device  # (the emulators run on the CPU; the sampler moves nothing)
    games = AtariGames(
        game=game,
        num_envs=num_envs,
        noop_max=noop_max,
        frame_skip=frame_skip,
        max_pool=max_pool,
        screen_size=screen_size,
        grayscale=grayscale,
        frame_stack=frame_stack,
        episodic_life=episodic_life,
        fire_reset=fire_reset,
        clip_rewards=clip_rewards,
        repeat_action_probability=repeat_action_probability,
        full_action_space=full_action_space,
        max_episode_frames=max_episode_frames,
        num_threads=num_threads,
    )
    return GymVectorEnv(games, name=gym_id(game))


make_atari_env.batched_env = "rl_envs.atari.make_atari_batched_env"  # type: ignore[attr-defined]
