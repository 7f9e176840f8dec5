"""Every config under conf/ composes, resolves, names real targets, and passes verification."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import open_dict

from rl.engine.run import train
from rl.engine.settings import verify_train_cfg
from rl.tasks.factory import FRAMEWORK_KEYS
from rl.utils.config import ConfigError, import_target

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("task", "model", "pipeline", "sampler", "logger")


def _stems(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


EXPERIMENTS = _stems("experiment")
DEBUG_OVERLAYS = _stems("debug")
GROUP_OPTIONS = [(group, option) for group in GROUPS for option in _stems(group)]
YAML_FILES = sorted(p for p in CONF.rglob("*.yaml") if "hydra" not in p.relative_to(CONF).parts)


def test_conf_has_configs_to_test() -> None:
    assert "ppo_nav" in EXPERIMENTS
    assert all(_stems(group) for group in GROUPS)


# ----------------------------------------------------------------- composition
@pytest.mark.parametrize("stem", EXPERIMENTS)
def test_experiment_composes_and_resolves(compose_cfg, resolve_cfg, stem: str) -> None:
    cfg = compose_cfg([f"+experiment={stem}"])
    plain = resolve_cfg(cfg)
    # Experiments for any gym environment are named after it (ppo_cartpole -> ppo_CartPole-v1).
    named_after_env = f"ppo_{plain['task'].get('env_id')}"
    assert plain["exp_name"] in (stem, named_after_env)
    for group in GROUPS:
        assert isinstance(plain[group], dict), group


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_group_option_composes_and_resolves(compose_cfg, resolve_cfg, group, option) -> None:
    plain = resolve_cfg(compose_cfg([f"{group}={option}"]))
    assert isinstance(plain[group], dict)


@pytest.mark.parametrize("overlay", DEBUG_OVERLAYS)
def test_debug_overlay_composes_on_experiment(compose_cfg, resolve_cfg, overlay: str) -> None:
    base = resolve_cfg(compose_cfg(["+experiment=ppo_nav"]))
    plain = resolve_cfg(compose_cfg(["+experiment=ppo_nav", f"+debug={overlay}"]))
    assert plain["exp_name"] == "ppo_nav"
    assert plain != base  # the overlay changed something
    verify_train_cfg(plain)


def test_smoke_overlay_shrinks_the_run(compose_cfg, resolve_cfg) -> None:
    plain = resolve_cfg(compose_cfg(["+experiment=ppo_nav", "+debug=smoke"]))
    assert plain["total_env_steps"] == 256
    # Interpolated budgets follow the overlay's total, not the experiment's.
    assert plain["pipeline"]["stages"][0]["max_stage_steps"] == 256
    assert plain["pipeline"]["named_losses"]["ppo"]["clip_decay"]["steps"] == 256


def test_evaluate_config_composes(compose_cfg, resolve_cfg) -> None:
    plain = resolve_cfg(compose_cfg(["ckpt=some.pt"], config_name="evaluate"))
    assert plain["ckpt"] == "some.pt"
    assert plain["num_episodes"] >= 1


# ------------------------------------------------------------------ _target_s
def _target_nodes(node: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        if "_target_" in node:
            found.append((where, node))
        for key, value in node.items():
            found += _target_nodes(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _target_nodes(value, f"{where}.{i}")
    return found


TARGET_NODES = [
    pytest.param(where, node, id=where)
    for path in YAML_FILES
    for where, node in _target_nodes(yaml.safe_load(path.read_text()), str(path.relative_to(CONF)))
]


def test_yaml_walk_finds_targets() -> None:
    # The walk must see the nested ones (a stage, a loss, a schedule), not only the roots.
    ids = [p.id for p in TARGET_NODES]
    assert "task/nav.yaml" in ids  # a file's root is found as the file itself
    assert any(".stages.0" in i for i in ids)
    assert any("named_losses.ppo.clip_decay" in i for i in ids)


@pytest.mark.parametrize(("where", "node"), TARGET_NODES)
def test_target_imports_and_accepts_its_keys(where: str, node: dict[str, Any]) -> None:
    target = import_target(node["_target_"])
    assert callable(target)
    # (``defaults``: a file's defaults list, which Hydra reads, not the target.)
    kwargs = {k: v for k, v in node.items() if not k.startswith("_") and k != "defaults"}
    if where.startswith("task/") and where.endswith(".yaml"):
        # A task file's root: build_env reads its framework keys itself (rl.tasks.factory).
        kwargs = {k: v for k, v in kwargs.items() if k not in FRAMEWORK_KEYS}
    inspect.signature(target).bind_partial(**kwargs)  # TypeError on an unknown keyword


@pytest.mark.parametrize("option", _stems("pipeline"))
def test_stage_loss_names_exist(compose_cfg, resolve_cfg, option: str) -> None:
    pipe = resolve_cfg(compose_cfg([f"pipeline={option}"]))["pipeline"]
    assert pipe["stages"]
    for stage in pipe["stages"]:
        assert set(stage["loss_names"]) <= set(pipe["named_losses"])


# -------------------------------------------------------------- verification
def test_verify_accepts_ppo_nav(compose_cfg, resolve_cfg) -> None:
    verify_train_cfg(resolve_cfg(compose_cfg(["+experiment=ppo_nav"])))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param(
            ["+pipeline.named_losses.ppo.clip=0.3"],
            ["pipeline.named_losses.ppo.clip"],
            id="unknown-loss-key",
        ),
        pytest.param(["pipeline.num_steps=abc"], ["pipeline.num_steps"], id="wrong-type"),
        pytest.param(
            ["pipeline.stages.0.loss_names=[nope]"],
            ["nope", "pipeline.stages.0.loss_names"],
            id="missing-loss",
        ),
        pytest.param(["pipeline.num_mini_batch=1000"], ["num_mini_batch"], id="minibatch-split"),
        pytest.param(
            ["pipeline.recurrence=24"], ["pipeline.recurrence", "divide"], id="bptt-chunks"
        ),
        pytest.param(["pipeline.recurrence=-1"], ["pipeline.recurrence"], id="bptt-range"),
        pytest.param(["+model.foo=1"], ["model.foo"], id="unknown-model-key"),
        # The collector's settings, before any worker starts: ranges from its annotations,
        # the rules between them from its config_errors.
        pytest.param(
            ["collector=process", "collector.mode=sideways"], ["collector.mode"], id="worker-mode"
        ),
        pytest.param(
            ["collector=ray", "collector.fraction_samples=1.5", "collector.max_policy_lag=-1"],
            ["collector.fraction_samples", "collector.max_policy_lag"],
            id="worker-ranges",
        ),
        pytest.param(
            ["collector=process", "collector.num_workers=65"],
            ["collector.num_workers=65 > sampler.num_envs=64"],
            id="workers-over-envs",
        ),
        pytest.param(
            ["collector=process", "collector.num_workers=3", "collector.rollouts_per_update=1"],
            ["collector.rollouts_per_update=1 < num_workers=3", "num_envs=64"],
            id="uneven-split",
        ),
        pytest.param(
            ["collector=ray", "collector.num_workers=auto", "collector.address=auto"],
            ["collector.num_workers: auto counts this machine's cores"],
            id="auto-on-a-cluster",
        ),
    ],
)
def test_verify_names_the_offending_key(
    compose_cfg, resolve_cfg, overrides: list[str], expected: list[str]
) -> None:
    plain = resolve_cfg(compose_cfg(["+experiment=ppo_nav", *overrides]))
    assert plain["sampler"]["num_envs"] == 64  # ppo_nav composed
    with pytest.raises(ConfigError) as info:
        verify_train_cfg(plain)
    for fragment in expected:
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param(["valid.num_envs=0"], "valid.num_envs: must be >= 1, got 0", id="range"),
        pytest.param(["eval.interval=-5"], "eval.interval: must be >= 0", id="eval-range"),
        pytest.param(
            ["distributed.backend=tcp"], "distributed.backend: expected one of", id="choices"
        ),
        pytest.param(["torch_threads=0"], "torch_threads: must be >= 1", id="run-key-range"),
        pytest.param(
            ["torch_threads=many"],
            "torch_threads: expected a number or 'auto', got 'many'",
            id="threads-word",
        ),
        pytest.param(["seed=abc"], "seed: expected int, got 'abc'", id="run-key-type"),
        pytest.param(["~eval.action_seed"], "eval.action_seed: missing", id="missing-key"),
        pytest.param(["~valid"], "valid: missing (null turns it off)", id="missing-section"),
        pytest.param(["pipeline.gamma=1.5"], "pipeline.gamma: must be <= 1, got 1.5", id="gamma"),
        pytest.param(
            ["pipeline.optimizer.lr=-1"], "pipeline.optimizer.lr: must be > 0, got -1", id="lr"
        ),
        pytest.param(
            ["pipeline.optimizer.lr=fast"],
            "pipeline.optimizer.lr: expected a number, got 'fast'",
            id="lr-type",
        ),
        pytest.param(
            ["pipeline.named_losses.ppo.clip_param=0"],
            "pipeline.named_losses.ppo.clip_param: must be > 0, got 0",
            id="loss-range",
        ),
        pytest.param(
            ["+pipeline.stages.0.gamma=2"],
            "pipeline.stages.0.gamma: must be <= 1, got 2",
            id="stage-override-range",
        ),
        pytest.param(
            ["pipeline.advantage.gae_lambda=2"],
            "pipeline.advantage.gae_lambda: must be <= 1, got 2",
            id="advantage",
        ),
        pytest.param(
            ["+pipeline.stages.0.advantage={_target_: rl.storage.VTrace, c_bar: 0}"],
            "pipeline.stages.0.advantage.c_bar: must be > 0, got 0",
            id="stage-advantage",
        ),
        pytest.param(
            ["pipeline/advantage=vtrace", "pipeline.advantage.c_bar=0"],
            "pipeline.advantage.c_bar: must be > 0, got 0",
            id="vtrace",
        ),
        pytest.param(
            ["task=gym", "task.env_id=CartPole-v1", "task.wrappers=[no.such.Wrapper]"],
            "task.wrappers.0: cannot use 'no.such.Wrapper' as a wrapper",
            id="wrapper-path",
        ),
        pytest.param(
            ["model.rnn=transformer"],
            "model.rnn: expected one of gru, lstm, got 'transformer'",
            id="model-rnn",
        ),
        pytest.param(
            ["normalize.clip=0"], "normalize.clip: must be > 0, got 0", id="normalize-clip"
        ),
    ],
)
def test_settings_sections_are_typed_and_ranged(
    compose_cfg, resolve_cfg, overrides: list[str], expected: str
) -> None:
    plain = resolve_cfg(compose_cfg(["+experiment=ppo_nav", *overrides]))
    with pytest.raises(ConfigError) as info:
        verify_train_cfg(plain)
    assert expected in str(info.value)


def test_out_of_range_values_are_all_reported_at_once(compose_cfg, resolve_cfg) -> None:
    plain = resolve_cfg(
        compose_cfg(["+experiment=ppo_nav", "pipeline.gamma=1.5", "pipeline.optimizer.lr=-1"])
    )
    with pytest.raises(ConfigError) as info:
        verify_train_cfg(plain)
    assert "pipeline.gamma" in str(info.value) and "pipeline.optimizer.lr" in str(info.value)


def test_null_sections_turn_evaluation_off(compose_cfg, resolve_cfg) -> None:
    verify_train_cfg(resolve_cfg(compose_cfg(["+experiment=ppo_nav", "eval=null", "valid=null"])))


def test_verify_reports_every_error_at_once(compose_cfg, resolve_cfg) -> None:
    plain = resolve_cfg(
        compose_cfg(["+experiment=ppo_nav", "+model.foo=1", "pipeline.num_steps=abc"])
    )
    with pytest.raises(ConfigError) as info:
        verify_train_cfg(plain)
    assert "model.foo" in str(info.value)
    assert "pipeline.num_steps" in str(info.value)


def test_train_rejects_bad_config_before_creating_anything(compose_cfg, tmp_path) -> None:
    cfg = compose_cfg(["+experiment=ppo_nav", "+debug=smoke", "+model.foo=1"])
    with open_dict(cfg):
        del cfg["hydra"]  # @hydra.main hands train() the config without its hydra node
    output_dir = Path(cfg.output_dir)
    assert output_dir.is_relative_to(tmp_path)
    with pytest.raises(ConfigError, match="model.foo"):
        train(cfg)
    assert not (output_dir / "checkpoints").exists()
    assert not output_dir.exists()


def test_integral_floats_are_accepted_for_integer_keys(compose_cfg, tmp_path) -> None:
    """``total_env_steps=2.56e2`` is 256 everywhere it is interpolated; nested keys too."""
    cfg = compose_cfg(
        [
            "+experiment=ppo_nav",
            "+debug=smoke",
            "total_env_steps=2.56e2",
            "pipeline.save_interval=1.28e2",
        ]
    )
    with open_dict(cfg):
        del cfg["hydra"]
    train(cfg)
    saved = yaml.safe_load((Path(cfg.output_dir) / "config.yaml").read_text())
    assert saved["total_env_steps"] == 256 and isinstance(saved["total_env_steps"], int)
    assert saved["pipeline"]["save_interval"] == 128
    assert saved["pipeline"]["stages"][0]["max_stage_steps"] == 256
    names = sorted(p.name for p in (Path(cfg.output_dir) / "checkpoints").glob("ckpt_*.pt"))
    assert names == ["ckpt_stage00_step000000000128.pt", "ckpt_stage00_step000000000256.pt"]


@pytest.mark.parametrize(
    "experiment",
    ["ppo_cartpole", "ppo_classic_control", "ppo_continuous", "ppo_mujoco", "ppo_minigrid"],
)
def test_gym_experiments_are_named_after_the_environment_and_bind_no_task_key(
    compose_cfg, resolve_cfg, experiment: str
) -> None:
    plain = resolve_cfg(compose_cfg([f"+experiment={experiment}", "task.env_id=Acrobot-v1"]))
    assert plain["exp_name"] == "ppo_Acrobot-v1"
    bare = resolve_cfg(compose_cfg(["task=gym", "task.env_id=Acrobot-v1", "model=mlp"]))
    assert bare["exp_name"] == "Acrobot-v1"  # no experiment: named after the environment
    swapped = resolve_cfg(compose_cfg([f"+experiment={experiment}", "task=nav_small"]))
    assert (
        swapped["task"]["_target_"] == "rl_envs.pointnav.PointNavEnv"
    )  # no task.env_id: unknown key
    # a task of one's own is named after its _target_, not the preset's environment
    assert swapped["exp_name"] == "ppo_PointNavEnv"
    verify_train_cfg(swapped)


def test_torch_threads_auto_is_one_per_process_on_the_cpu(compose_cfg, resolve_cfg) -> None:
    from rl.utils.threads import available_cores, torch_thread_count

    for stem in ("train", "evaluate"):
        cfg = compose_cfg([] if stem == "evaluate" else ["+experiment=ppo_cartpole"], stem)
        assert resolve_cfg(cfg)["torch_threads"] == "auto"
    assert torch_thread_count("auto", "cpu") == 1
    assert torch_thread_count("auto", "cuda:0") == min(4, available_cores())
    assert torch_thread_count(3, "cpu") == 3 and torch_thread_count(None, "cpu") is None
    verify_train_cfg(resolve_cfg(compose_cfg(["+experiment=ppo_nav", "torch_threads=auto"])))


def test_a_run_checks_its_config_once(compose_cfg, monkeypatch) -> None:
    """train() checks the composed config once; a fresh run does not check it again."""
    import rl.engine.run as engine_run

    checked: list[int] = []
    original = engine_run.verify_train_cfg

    def counting(cfg: Any) -> None:
        checked.append(id(cfg))
        original(cfg)

    monkeypatch.setattr(engine_run, "verify_train_cfg", counting)
    engine_run.train(
        compose_cfg(
            [
                "+experiment=ppo_cartpole",
                "+debug=smoke",
                "eval.num_episodes=0",
                "logger.sinks.console.progress_bar=false",
            ]
        )  # fmt: skip
    )
    assert len(checked) == 1, checked


@pytest.mark.parametrize("collector", ["ray", "process"])
def test_every_collector_takes_the_documented_timeout(compose_cfg, resolve_cfg, collector) -> None:
    """docs/concepts/collection-workers.md: ``collector.timeout`` (the hang watchdog)."""
    plain = resolve_cfg(
        compose_cfg(["+experiment=ppo_nav", f"collector={collector}", "collector.timeout=60"])
    )
    assert plain["collector"]["timeout"] == 60
    verify_train_cfg(plain)


@pytest.mark.parametrize("experiment", [[], ["+experiment=ppo_nav"]], ids=["none", "ppo_nav"])
def test_a_run_without_an_experiment_says_so(compose_cfg, caplog, experiment) -> None:
    import rl.engine.run as engine_run

    cfg = compose_cfg(
        [*experiment, "+debug=smoke", "task=nav_small", "model.cnn_channels=[8]",
         "eval.num_episodes=0", "valid=null", "logger.sinks.console.progress_bar=false"]
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="rl.engine.run"):
        engine_run.train(cfg)
    warned = [r.getMessage() for r in caplog.records if "no +experiment=" in r.getMessage()]
    assert bool(warned) == (not experiment), warned
    if warned:
        assert "task=nav_small" in warned[0] and "+experiment=ppo_nav" in warned[0]


def test_a_callback_without_the_hooks_is_named(compose_cfg) -> None:
    import rl.engine.run as engine_run

    cfg = compose_cfg(
        ["+experiment=ppo_cartpole", "+debug=smoke", "eval.num_episodes=0",
         "callbacks=[{_target_: collections.OrderedDict}]"]
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"callbacks.0: collections.OrderedDict built a "
                       r"OrderedDict without on_train_start"):  # fmt: skip
        engine_run.train(cfg)


def test_the_documented_log_std_init_applies_to_the_mlp(compose_cfg, resolve_cfg) -> None:
    """docs/concepts/policies.md: ``model.log_std_init`` on ``model=mlp`` (declared there)."""
    plain = resolve_cfg(compose_cfg(["task=pendulum", "model=mlp", "model.log_std_init=-0.5"]))
    assert plain["model"]["log_std_init"] == -0.5
    verify_train_cfg(plain)


def test_a_task_target_swapped_on_a_preset_says_how_to_swap_the_whole_task(
    compose_cfg, resolve_cfg
) -> None:
    """task._target_ alone keeps the preset task's other keys: the error names each with the
    override that drops it, and those overrides make the config valid."""
    swap = ["+experiment=ppo_classic_control", "task._target_=rl_envs.toys.spaces.MatchTargetEnv"]
    with pytest.raises(ConfigError) as info:
        verify_train_cfg(resolve_cfg(compose_cfg(swap)))
    assert "drop them (~task.env_id ~task.env_kwargs ~task.wrappers)" in str(info.value)
    drops = ["~task.env_id", "~task.env_kwargs", "~task.wrappers"]
    verify_train_cfg(resolve_cfg(compose_cfg([*swap, *drops])))
