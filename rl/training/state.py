"""A trainer's checkpoint: what is saved, from which component, and how it comes back.

Checkpoints are taken at rollout boundaries, after the stage bookkeeping. They hold every
generator and the collector's episodes in flight, so a resumed run continues bitwise like an
uninterrupted one (single-process sampler, CPU). The layout (:data:`CHECKPOINT_FORMAT`) is flat
and ``torch.load(weights_only=True)``-safe::

    format_version, model, losses, optimizer, lr_scheduler, pipeline,
    trackers {episode, train, criteria}, finished_episodes,
    trainer {last_metrics, last_log_step, offpolicy_update_count, nonfinite_skips},
    rng {python, numpy, torch, shuffle, offpolicy}, sampler, rollout, normalizer,
    config, choices, config_sources, wandb_run_id, [distributed {world_size, ranks}]

Distributed, saving is a collective: rank 0's checkpoint also holds every rank's ``sampler``,
``rollout``, ``rng`` and unlogged metrics, and each rank resumes from its own (:func:`rank_view`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch

from rl.checkpoints.errors import CheckpointError
from rl.checkpoints.files import CHECKPOINT_FORMAT
from rl.collection.base import Collector
from rl.distributed.reduce import gather_objects
from rl.distributed.setup import DistContext
from rl.models.policy import Policy
from rl.pipeline.stages import TrainingPipeline
from rl.training.learner import Learner
from rl.training.metrics import TrainingMetrics
from rl.utils.finite import as_count
from rl.utils.saved import checked_weights, saved_like
from rl.utils.seeding import rng_state, set_rng_state

log = logging.getLogger(__name__)

# Per-rank entries of a distributed checkpoint.
# Each rank's own: its environments, generators and the metrics it has not logged yet (the
# trackers' sums and the interval's finished episodes, reduced over the ranks at a log point).
_RANK_KEYS = (
    "sampler",
    "rollout",
    "rng",
    "collection_workers",
    "trackers",
    "finished_episodes",
)


@dataclasses.dataclass
class RunRecord:
    """What a checkpoint says about its run (beside the training state).

    Attributes:
        config: Resolved run config.
        choices: Its config group choices (``task=nav_small``, ...), by which evaluation and
            resuming rebuild it on the user's config tree (None: not composed by Hydra).
        wandb_run_id: Id of the wandb run (so a resume continues the same run).
        sources: Where its configs came from (:func:`~rl.checkpoints.config_tree.run_sources`),
            named when a tree without them is given (None: not composed by Hydra).
    """

    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    choices: dict[str, str] | None = None
    wandb_run_id: str | None = None
    sources: dict[str, Any] | None = None


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor inside (dicts, lists, tuples) moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def rank_view(state: Mapping[str, Any], dist: DistContext) -> dict[str, Any]:
    """``state`` with this rank's entries (:data:`_RANK_KEYS`).

    A checkpoint saved with another number of ranks (or by one process) has no entries for
    this layout: every rank then starts fresh episodes (a warning says so), and only rank 0
    keeps the unlogged metrics (the saving process's).
    """
    saved = state.get("distributed")
    ranks = saved.get("ranks") if isinstance(saved, Mapping) else None
    if isinstance(ranks, list) and len(ranks) == dist.world_size:
        own = ranks[dist.rank]
        if not isinstance(own, Mapping):
            where = f"distributed.ranks[{dist.rank}]"
            raise CheckpointError(f"checkpoint entry {where}: expected a mapping")
        return {**state, **own}
    if dist.is_main:
        log.warning(
            "the checkpoint holds no per-rank state for %d ranks (saved with %s): "
            "every rank starts fresh episodes",
            dist.world_size,
            saved.get("world_size", "one process") if isinstance(saved, Mapping) else "?",
        )
    fresh = dict.fromkeys(("sampler", "rollout", "collection_workers"), None)
    if not dist.is_main:  # rank 0's unlogged metrics, counted once
        fresh.update(trackers=None, finished_episodes=None)
    return {**state, **fresh}


@dataclasses.dataclass
class TrainerState:
    """The components whose state makes up a trainer's checkpoint."""

    model: Policy
    pipeline: TrainingPipeline
    learner: Learner
    metrics: TrainingMetrics
    collector: Collector
    run: RunRecord
    dist: DistContext

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly (a collective when distributed)."""
        learner = self.learner.state_dict()
        metrics = self.metrics.state_dict()
        state: dict[str, Any] = {
            "format_version": CHECKPOINT_FORMAT,
            "model": self.model.state_dict(),
            "losses": self.learner.losses_state_dict(),  # auxiliary heads, by loss name
            "optimizer": learner["optimizer"],
            "lr_scheduler": learner["lr_scheduler"],
            "pipeline": self.pipeline.state_dict(),
            "trackers": metrics["trackers"],
            "finished_episodes": metrics["finished"],  # since the last log point
            "trainer": {
                "last_metrics": metrics["last_metrics"],
                "last_log_step": metrics["last_log_step"],
                "offpolicy_update_count": learner["offpolicy_update_count"],
                "nonfinite_skips": learner["nonfinite_skips"],
            },
            "rng": {
                **rng_state(),
                "shuffle": learner["shuffle"],
                "offpolicy": learner["offpolicy"],
            },
            **self.collector.state_dict(),  # in-process collection: sampler, rollout
            "config": self.run.config,
            "choices": self.run.choices,
            "config_sources": self.run.sources,
            "wandb_run_id": self.run.wandb_run_id,
        }
        if self.dist.enabled:
            ranks = gather_objects({k: _to_cpu(state.get(k)) for k in _RANK_KEYS})
            if ranks is not None:
                state["distributed"] = {"world_size": self.dist.world_size, "ranks": ranks}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a loaded checkpoint written by :meth:`state_dict` (before training)."""
        if self.dist.enabled:
            state = rank_view(state, self.dist)
        trainer, rng = _entry(state, "trainer"), _entry(state, "rng", required=True)
        learner = {
            "optimizer": state["optimizer"],
            "lr_scheduler": state.get("lr_scheduler"),
            "offpolicy_update_count": trainer.get("offpolicy_update_count", 0),
            "nonfinite_skips": trainer.get("nonfinite_skips", 0),
            "shuffle": rng.get("shuffle"),
            "offpolicy": rng.get("offpolicy"),
        }
        weights, losses = _checked_weights(self.model, self.learner, state)  # (anyone's file)
        _check_learner_state(self.learner, learner)
        self.model.load_state_dict(weights)
        self.learner.load_losses_state_dict(losses)
        self.learner.load_state_dict(learner)
        self.pipeline.load_state_dict(state["pipeline"])
        if self.run.wandb_run_id is None:
            self.run.wandb_run_id = state.get("wandb_run_id")
        self.metrics.load_state_dict(
            {
                **trainer,
                "trackers": state.get("trackers"),
                "finished": state.get("finished_episodes"),
            }
        )
        self.collector.load_state_dict(state)  # it reads the entries its state_dict wrote
        set_rng_state(rng)  # last: nothing above may draw from the global generators


def _checked_weights(
    model: Policy, learner: Learner, state: Mapping[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """The model's and the losses' saved weights, checked to fit this run's, to load.

    :func:`~rl.utils.saved.checked_weights`: the same names, dtypes (a weight of another dtype
    would be cast as it loads) and shapes, finite, with this run's module metadata; a loss with
    parameters (an auxiliary head) must have its state in the file. A :class:`CheckpointError`
    names the first that does not fit.
    """
    saved_losses = _entry(state, "losses")
    missing = [name for name in learner.loss_modules if name not in saved_losses]
    if missing:
        raise CheckpointError(f"the checkpoint holds no state of the loss {missing[0]!r}")
    try:
        weights = checked_weights(state["model"], model, "model")
        losses = {
            name: checked_weights(saved_losses[name], module, f"losses.{name}")
            for name, module in learner.loss_modules.items()
        }
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return weights, losses


def _entry(state: Mapping[str, Any], key: str, required: bool = False) -> Mapping[str, Any]:
    """``state[key]``, a mapping (absent or None: empty, unless ``required``).

    Raises:
        CheckpointError: It is not a mapping, or ``required`` and absent.
    """
    value = state.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise CheckpointError(f"checkpoint entry {key}: expected a mapping")
    return value


def _check_learner_state(learner: Learner, saved: dict[str, Any]) -> None:
    """A :class:`CheckpointError` naming the first value of ``saved`` the learner cannot hold.

    The file may be anyone's: nothing is restored before this check. The optimizer's and the
    LR scheduler's states must have the structure and kinds of the learner's own
    (:func:`_check_like`); each parameter's state the keys, dtypes and shapes the optimizer
    keeps (:func:`_fresh_state`), its step and second moments >= 0; counters counts. A
    hyperparameter the file lacks (saved by an older torch) is the config's.
    """
    for key in ("offpolicy_update_count", "nonfinite_skips"):
        if as_count(saved[key]) is None:
            raise CheckpointError(f"checkpoint entry trainer.{key}: expected an int >= 0")
    stages = {str(i) for i, s in enumerate(learner.pipeline.stages) if s.offpolicy_component}
    offpolicy = {} if saved["offpolicy"] is None else saved["offpolicy"]
    if not isinstance(offpolicy, Mapping) or not set(offpolicy) <= stages:
        where = "checkpoint entry rng.offpolicy"
        raise CheckpointError(f"{where}: expected states of stages {sorted(stages)}")
    own = learner.state_dict()
    optimizer = saved["optimizer"]
    if not isinstance(optimizer, Mapping) or set(optimizer) != {"state", "param_groups"}:
        raise CheckpointError("checkpoint entry optimizer: expected a dict of state, param_groups")
    groups = optimizer["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(own["optimizer"]["param_groups"]):
        raise CheckpointError("checkpoint entry optimizer.param_groups: not this optimizer's")
    groups = [
        {**mine, **group} if isinstance(group, Mapping) else group
        for group, mine in zip(groups, own["optimizer"]["param_groups"], strict=True)
    ]
    _check_like(groups, own["optimizer"]["param_groups"], "optimizer.param_groups")
    for i, (group, mine) in enumerate(zip(groups, own["optimizer"]["param_groups"], strict=True)):
        # The learning rate is the config's (not a setting a resume may change): under a
        # schedule its base (the group's lr moves with the schedule), else the lr itself.
        key = "initial_lr" if "initial_lr" in mine else "lr"
        if group[key] != mine[key]:
            raise CheckpointError(
                f"checkpoint entry optimizer.param_groups[{i}].{key}: {group[key]!r:.40} where "
                f"this run's config has {mine[key]!r}"
            )
    positions: dict[Any, int] = {}  # a saved parameter index -> the parameter's position
    for i, (group, current) in enumerate(zip(groups, learner.optimizer.param_groups, strict=True)):
        ids = group["params"]
        if not (
            isinstance(ids, list)
            and len(ids) == len(current["params"])
            and all(as_count(k) is not None for k in ids)
            and len(set(ids)) == len(ids)
            and not set(ids) & set(positions)
        ):
            raise CheckpointError(
                f"checkpoint entry optimizer.param_groups[{i}].params: expected "
                f"{len(current['params'])} distinct parameter indices"
            )
        positions.update({k: n for n, k in enumerate(ids, start=len(positions))})
    moments = optimizer["state"]
    if not isinstance(moments, Mapping) or not set(moments) <= set(positions):
        raise CheckpointError("checkpoint entry optimizer.state: expected a state per parameter")
    fresh = _fresh_state(learner.optimizer)
    kind = type(learner.optimizer).__name__
    for index, values in moments.items():
        like = fresh[positions[index]]
        if not (
            isinstance(values, Mapping)
            and set(values) == set(like)
            and all(_moment_fits(key, values[key], mine) for key, mine in like.items())
        ):
            raise CheckpointError(
                f"checkpoint entry optimizer.state.{index}: expected the state {kind} keeps of "
                f"its parameter: {', '.join(sorted(like))}, each of its dtype and shape, finite "
                "(the step and second moments >= 0)"
            )
    saved["optimizer"] = {"state": moments, "param_groups": groups}
    scheduler, mine = saved["lr_scheduler"], own["lr_scheduler"]
    if mine is not None and scheduler is not None:
        if not isinstance(scheduler, Mapping) or not set(scheduler) <= set(mine):
            raise CheckpointError(
                f"checkpoint entry lr_scheduler: expected keys of {sorted(mine)}"
            )
        for key, value in scheduler.items():
            if key != "lr_lambdas":  # (never restored: the config's functions are kept)
                _check_like(value, mine[key], f"lr_scheduler.{key}", flags_equal=False)
        if scheduler.get("base_lrs", mine["base_lrs"]) != mine["base_lrs"]:
            raise CheckpointError(
                f"checkpoint entry lr_scheduler.base_lrs: {scheduler['base_lrs']!r:.60} where "
                f"this run's config has {mine['base_lrs']!r} (the learning rate is the config's)"
            )


# Per-parameter optimizer states that are never negative: the step, and torch's second moments
# (Adam's, AdamW's, RMSprop's, Adagrad's, Adadelta's, Adamax's); a negative one is a NaN step.
_NONNEGATIVE = frozenset(
    {"step", "exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum", "acc_delta", "exp_inf"}
)


def _fresh_state(optimizer: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    """The state ``optimizer``'s kind keeps per parameter, in parameter order.

    Its keys, dtypes and shapes: one step of a twin on zeros of the parameters, with the same
    settings and zero gradients (whatever the optimizer, a checkpoint's state must be this).
    """
    groups = []
    for group in optimizer.param_groups:
        params = [torch.zeros_like(p, requires_grad=True) for p in group["params"]]
        for p in params:
            p.grad = torch.zeros_like(p)
        groups.append({**group, "params": params})
    kind: Any = type(optimizer)  # (its own signature: the settings are in the groups)
    twin = kind(groups)
    twin.step()
    return [dict(twin.state[p]) for group in groups for p in group["params"]]


def _moment_fits(key: str, saved: Any, mine: Any) -> bool:
    """Whether ``saved`` may stand where a fresh state holds ``mine`` (a tensor, or a number)."""
    if not isinstance(mine, torch.Tensor):
        return type(saved) is type(mine)
    return (
        isinstance(saved, torch.Tensor)
        and saved.dtype == mine.dtype
        and saved.shape == mine.shape
        and (key not in _NONNEGATIVE or not bool((saved < 0).any()))
    )


def _check_like(saved: Any, own: Any, where: str, flags_equal: bool = True) -> None:
    """:func:`~rl.utils.saved.saved_like` (``params`` checked apart), as a CheckpointError."""
    try:
        saved_like(saved, own, where, flags_equal=flags_equal, skip=("params",))
    except ValueError as e:
        raise CheckpointError(str(e)) from None
