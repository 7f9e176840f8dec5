"""Learning from rollouts: the optimiser, the LR schedule, and the updates.

One optimisation step (:meth:`Learner.optimize`: weighted losses -> backward -> gradient
all-reduce -> clip -> optimiser step) serves both the on-policy update (:meth:`Learner.update`:
advantages, then ``update_repeats`` epochs of ``num_mini_batch`` minibatches of sequences) and
the off-policy one (:meth:`Learner.update_off_policy`). The LR schedule is stepped to the
env-step count (AllenAct's semantics), not the update count.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from tensordict import TensorDict

from rl.collection.base import Rollout
from rl.distributed.reduce import advantage_stats, average_gradients, weighted_moments
from rl.distributed.setup import DistContext
from rl.losses.auxiliary import loss_modules
from rl.models.policy import Policy, PolicyOutput
from rl.pipeline.offpolicy import OffPolicyPipelineComponent
from rl.pipeline.schedules import step_lr_scheduler_to
from rl.pipeline.stages import PipelineStage, TrainingPipeline, TrainingSettings
from rl.pipeline.trackers import ScalarMeanTracker
from rl.storage.estimators import AdvantageEstimator
from rl.storage.rollout import sequence_start_state
from rl.tasks.agents import AGENT_ACTIVE
from rl.utils.finite import NonFiniteError

log = logging.getLogger(__name__)

UpdateForward = Callable[..., tuple[PolicyOutput, TensorDict]]


def compiled_forward(model: Policy, device: torch.device) -> UpdateForward:
    """``model``'s forward for the update, through ``torch.compile`` (``pipeline.compile``).

    On the CPU ``mode="default"``: a second minibatch shape (an uneven split, a stage's shortened
    last rollout) recompiles once with dynamic shapes. On CUDA ``mode="reduce-overhead"`` with
    ``dynamic=False``: CUDA graphs need static shapes, so one graph is recorded per shape.
    ``model`` itself is unchanged (its ``state_dict`` and ``act``).
    """
    module = cast(torch.nn.Module, model)
    if device.type == "cuda":
        compiled = torch.compile(module, mode="reduce-overhead", dynamic=False)
    else:
        compiled = torch.compile(module)
    return cast(UpdateForward, compiled)


class Learner:
    """Optimise ``model`` with the losses of ``pipeline``.

    Args:
        seed: Seed of the minibatch shuffling generator.
        dist: This process's place among the ranks (None: one process).
    """

    def __init__(
        self,
        *,
        model: Policy,
        pipeline: TrainingPipeline,
        device: torch.device | str,
        seed: int = 0,
        dist: DistContext | None = None,
    ) -> None:
        self.model = model
        self.pipeline = pipeline
        self.device = torch.device(device)
        self.dist = dist or DistContext(device=self.device)
        # Losses with parameters of their own (auxiliary heads) train beside the policy.
        self.loss_modules = loss_modules(pipeline.used_losses)
        unbound = [n for n, m in self.loss_modules.items() if not getattr(m, "bound", True)]
        if unbound:
            raise RuntimeError(
                f"pipeline losses {unbound} have no heads yet: call rl.losses.bind_losses("
                "pipeline.used_losses, policy, observation_space, action_space) before "
                "building the learner (the engine does)"
            )
        params = list(model.parameters())
        for module in self.loss_modules.values():
            params += list(module.parameters())
        self.optimizer = pipeline.optimizer_builder(params=params)
        self.lr_scheduler = (
            pipeline.lr_scheduler_builder(optimizer=self.optimizer)
            if pipeline.lr_scheduler_builder is not None
            else None
        )
        self.shuffle_generator = torch.Generator().manual_seed(seed)
        self.offpolicy_update_count = 0
        self.nonfinite_skips = 0  # optimisation steps dropped for a non-finite loss (``skip``)
        self._params = [p for p in params if p.requires_grad]
        self._compiled = pipeline.compile
        self._compile_proven = False  # a compiled call returned (errors after it are not its)
        self._forward = (  # the on-policy update's forward
            compiled_forward(model, self.device) if self._compiled else cast(UpdateForward, model)
        )
        if self.dist.enabled:  # each rank draws its own off-policy data
            for stage in pipeline.stages:
                if stage.offpolicy_component is not None:
                    stage.offpolicy_component.shard(self.dist.rank, self.dist.world_size)

    @property
    def learning_rate(self) -> float:
        """The current learning rate (of the first parameter group)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def step_schedules(self, env_steps: int) -> None:
        """Move the LR schedule to global env step ``env_steps``."""
        if self.lr_scheduler is not None:
            step_lr_scheduler_to(self.lr_scheduler, env_steps)

    # ------------------------------------------------------------------ step
    def optimize(
        self,
        weighted_losses: Mapping[str, float],
        *,
        batch: Any,
        output: PolicyOutput,
        num_samples: int,
        max_grad_norm: float,
        step_count: int,
        prefix: str = "losses",
    ) -> dict[str, float]:
        """One optimisation step on ``batch``; returns what to log (NaNs left out).

        Args:
            weighted_losses: ``{loss name: weight}`` (names of the pipeline's named losses).
            batch: A rollout minibatch or an off-policy batch.
            output: The model run on ``batch``.
            num_samples: Samples behind the losses' means (the gradient all-reduce weight).
            max_grad_norm: Gradient-norm clipping threshold.
            step_count: Global env steps (for the losses' schedules).
            prefix: Logged keys are ``{prefix}/<loss>/<term>``, each loss's unweighted
                ``{prefix}/<loss>/total`` and its ``{prefix}/<loss>/weight``, ``{prefix}/total``
                (the sum of weight x total) and ``{prefix}/grad_norm``.
        """
        total: torch.Tensor | None = None
        logged: dict[str, float] = {}
        totals: dict[str, torch.Tensor] = {}
        for name, weight in weighted_losses.items():
            result = self.pipeline.named_losses[name](
                batch=batch, output=output, step_count=step_count
            )
            totals[name] = result.total.detach()
            term = result.total if weight == 1.0 else weight * result.total
            total = term if total is None else total + term
            for key, value in {**result.terms, **result.diagnostics}.items():
                logged[f"{prefix}/{name}/{key}"] = value
            logged[f"{prefix}/{name}/weight"] = float(weight)
        if total is None:
            raise ValueError(f"{prefix}: a step needs at least one loss")
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if self.dist.enabled:
            # ALGO: the gradient of the mean over every rank's batch (weighted by size).
            average_gradients(self._params, num_samples)
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, max_grad_norm)
        logged[f"{prefix}/total"] = total.item()
        for name, value in totals.items():  # computed already: no further device sync
            logged[f"{prefix}/{name}/total"] = value.item()
        logged[f"{prefix}/grad_norm"] = grad_norm.item()
        # HARNESS: judged after the gradient all-reduce, so every rank decides alike.
        finite = math.isfinite(logged[f"{prefix}/total"]) and math.isfinite(
            logged[f"{prefix}/grad_norm"]
        )
        if finite:
            self.optimizer.step()
        else:
            self._nonfinite(logged, prefix, step_count)
            self.optimizer.zero_grad(set_to_none=True)
        if self.pipeline.on_nonfinite == "skip":
            logged["losses/nonfinite_skipped"] = 0.0 if finite else 1.0
            if not finite:  # the skipped step's values would poison the interval's means
                return {"losses/nonfinite_skipped": 1.0}
        # Diagnostics without a value (explained variance of constant returns) are left out.
        return {k: v for k, v in logged.items() if not math.isnan(v)}

    def _nonfinite(self, logged: Mapping[str, float], prefix: str, step_count: int) -> None:
        """A NaN or infinite loss or gradient norm: an error, or a skipped step (``skip``).

        Raises:
            NonFiniteError: Naming the non-finite terms (``pipeline.on_nonfinite=error``).
        """
        bad = {k: v for k, v in logged.items() if not math.isfinite(v)}
        terms = [k for k in bad if not k.endswith(("/total", "/grad_norm"))]
        what = ", ".join(f"{k}={v}" for k, v in bad.items())
        cause = (
            f"loss term {', '.join(terms)}"
            if terms
            else "the gradient"
            if list(bad) == [f"{prefix}/grad_norm"]
            else "the weighted loss"
        )
        if self.pipeline.on_nonfinite == "error":
            raise NonFiniteError(
                f"non-finite {cause} at env step {step_count} ({what}); the update was not "
                "applied and no checkpoint holds it. pipeline.on_nonfinite=skip drops such "
                "steps instead"
            )
        self.nonfinite_skips += 1
        log.warning(
            "skipped an optimisation step at env step %d: non-finite %s (%s); %d skipped so far",
            step_count,
            cause,
            what,
            self.nonfinite_skips,
        )

    # --------------------------------------------------------------- updates
    def update(
        self,
        rollout: Rollout,
        stage: PipelineStage,
        settings: TrainingSettings,
        step_count: int,
    ) -> tuple[ScalarMeanTracker, float]:
        """The on-policy update of ``stage`` on ``rollout``: ``(logged means, seconds)``."""
        t0 = time.perf_counter()
        storage, model = rollout.storage, self.model
        tracker = ScalarMeanTracker()
        estimator: AdvantageEstimator = settings.advantage
        scalars = estimator(
            storage,
            model=model,
            next_value=rollout.next_value,
            gamma=settings.gamma,
        )
        tracker.add_scalars(dict(scalars))
        tracker.add_scalars(self._update_value_norms(storage.recorded()))
        if self.dist.enabled:
            # ALGO: per-rollout advantage normalisation with every rank's rollout (sum, sum of
            # squares and count all-reduced), independent of how the data is split over ranks.
            active = storage.data.get(AGENT_ACTIVE, None)  # several agents: those in play
            mean, std, _ = advantage_stats(
                storage["advantages"][: storage.step],
                None if active is None else active[: storage.step],
            )
            storage.advantage_stats = (mean, std)
        self._train_mode()
        for _ in range(settings.update_repeats):
            batches = storage.minibatches(
                settings.num_mini_batch,
                self.shuffle_generator,
                recurrence=settings.recurrence or 0,
            )
            for batch in batches:
                output = self._update_forward(batch)
                tracker.add_scalars(
                    self.optimize(
                        stage.weighted_losses,
                        batch=batch,
                        output=output,
                        num_samples=batch.numel(),
                        max_grad_norm=settings.max_grad_norm,
                        step_count=step_count,
                    )
                )
        return tracker, time.perf_counter() - t0

    def _update_forward(self, batch: TensorDict) -> PolicyOutput:
        """The policy on a minibatch ``[T, n]`` from its sequences' start states.

        Raises:
            RuntimeError: ``torch.compile`` failed (named, with the cause).
        """
        args = (batch["obs"], batch["episode_starts"], sequence_start_state(batch))
        if not self._compiled:
            return self._forward(*args)[0]
        if self.device.type == "cuda":  # a new step: the last graph's outputs may be reused
            torch.compiler.cudagraph_mark_step_begin()
        if self._compile_proven:
            return self._forward(*args)[0]
        try:
            output = self._forward(*args)[0]
        except Exception as e:
            raise RuntimeError(
                f"pipeline.compile=true: torch.compile of the policy's forward failed "
                f"({type(e).__name__}: {next(iter(str(e).splitlines()), '')}); "
                "pipeline.compile=false runs it eagerly"
            ) from e
        self._compile_proven = True
        return output

    def _update_value_norms(self, rollout: TensorDict) -> dict[str, float]:
        """Fold the rollout's returns into each of the policy's value norms; return what to log.

        Each norm takes the returns of its rows that count, over every rank under DDP (one
        all-reduce each), so the statistics stay equal on every rank.
        """
        value_norms = getattr(self.model, "value_norms", None)
        norms = [] if value_norms is None else value_norms(rollout["obs"])
        active = rollout.get(AGENT_ACTIVE, None)  # several agents: those in play
        logged: dict[str, float] = {}
        for i, (norm, rows) in enumerate(norms):
            weights = None if active is None else active.to(torch.float32)
            if rows is not None:
                rows = rows.to(torch.float32)
                weights = rows if weights is None else weights * rows
            total, total_sq, count = weighted_moments(rollout["returns"], weights)
            if count > 0:
                norm.update(total / count, total_sq / count)
            mean, std = norm.stats()
            name = "value_norm" if len(norms) == 1 else f"value_norm/{i}"
            logged.update({f"{name}/mean": float(mean), f"{name}/std": float(std)})
        return logged

    def update_off_policy(
        self,
        component: OffPolicyPipelineComponent,
        settings: TrainingSettings,
        step_count: int,
    ) -> tuple[ScalarMeanTracker, float]:
        """``component.updates`` off-policy steps: ``(logged means, seconds)``.

        Logged like the on-policy losses, but with the step's total and gradient norm under
        ``losses/offpolicy/``.
        """
        t0 = time.perf_counter()
        model, tracker = self.model, ScalarMeanTracker()
        self._train_mode()
        for _ in range(component.updates):
            batch = component.next_batch().to(self.device)
            starts = batch["episode_starts"]
            output, _ = model(
                batch["obs"], starts, model.initial_state(starts.shape[1], self.device)
            )
            logged = self.optimize(
                component.weighted_losses,
                batch=batch,
                output=output,
                num_samples=starts.numel(),
                max_grad_norm=settings.max_grad_norm,
                step_count=step_count,
            )
            for key in ("total", "grad_norm"):
                if f"losses/{key}" in logged:  # absent when a non-finite step was skipped
                    logged[f"losses/offpolicy/{key}"] = logged.pop(f"losses/{key}")
            tracker.add_scalars(logged)
            self.offpolicy_update_count += 1
        tracker.add_scalars({"pipeline/offpolicy_updates": component.updates})
        return tracker, time.perf_counter() - t0

    def _train_mode(self) -> None:
        self.model.train()
        for module in self.loss_modules.values():
            module.train()

    # ----------------------------------------------------------------- state
    def losses_state_dict(self) -> dict[str, dict[str, Any]]:
        """The state of every loss with parameters (auxiliary heads), by loss name."""
        return {name: module.state_dict() for name, module in self.loss_modules.items()}

    def load_losses_state_dict(self, state: Mapping[str, Mapping[str, Any]] | None) -> None:
        """Restore :meth:`losses_state_dict`.

        Raises:
            KeyError: ``state`` lacks a loss with parameters of this pipeline.
        """
        state = state or {}
        for name, module in self.loss_modules.items():
            if name not in state:
                raise KeyError(f"the checkpoint holds no state of the loss {name!r}")
            module.load_state_dict(state[name])

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler, update count, and the generators the updates draw from."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
            "offpolicy_update_count": self.offpolicy_update_count,
            "nonfinite_skips": self.nonfinite_skips,
            "shuffle": self.shuffle_generator.get_state(),
            "offpolicy": self._offpolicy_rng_states(),
        }

    def _offpolicy_rng_states(self) -> dict[str, torch.Tensor]:
        """Generator states of the stages' off-policy data iterators, by stage index."""
        out = {}
        for i, stage in enumerate(self.pipeline.stages):
            component = stage.offpolicy_component
            if component is not None and component.generator is not None:
                out[str(i)] = component.generator.get_state()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (missing generator states are skipped)."""
        self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            sched = dict(state["lr_scheduler"])
            # Keep the config's schedule functions (a resume may extend their horizon); restore
            # only the scheduler's counters.
            if "lr_lambdas" in sched:
                sched["lr_lambdas"] = [None] * len(sched["lr_lambdas"])
            self.lr_scheduler.load_state_dict(sched)
        self.offpolicy_update_count = int(state.get("offpolicy_update_count", 0))
        self.nonfinite_skips = int(state.get("nonfinite_skips") or 0)
        if state.get("shuffle") is not None:
            self.shuffle_generator.set_state(state["shuffle"])
        for index, generator_state in (state.get("offpolicy") or {}).items():
            component = self.pipeline.stages[int(index)].offpolicy_component
            if component is not None and component.generator is not None:
                component.generator.set_state(generator_state)
