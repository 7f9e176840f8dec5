"""``python -m rl.compare``: runs grouped by override, final and best metrics as mean ± std over
seeds, curves with a band; on a real 2 x 2 multirun and on crafted run folders."""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rl.evaluation.compare import find_runs, group_runs, main, read_run

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def write_run(folder: Path, overrides: list[str], points: list[dict]) -> Path:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    return folder


@pytest.mark.slow
def test_a_real_two_by_two_multirun_is_tabulated_and_plotted(tmp_path: Path, capsys) -> None:
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", "+experiment=ppo_nav", "+debug=smoke", "task=nav_small",
         "seed=1,2", "pipeline.optimizer.lr=1e-3,3e-3", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())  # named by their overrides
    assert jobs == [
        f"{n}_+experiment:ppo_nav__pipeline.optimizer.lr:{lr}__seed:{seed}__task:nav_small"
        for n, (seed, lr) in enumerate([(1, "0.001"), (1, "0.003"), (2, "0.001"), (2, "0.003")])
    ]
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "4 runs in 2 groups" in out
    # Groups are labelled by the runs' overrides (as typed), not by their folders' names.
    rows = [line for line in out.splitlines() if line.startswith("| pipeline.optimizer.lr=")]
    assert len(rows) == 2, out
    assert all("| 2    | 1 2   |" in row and "±" in row for row in rows), rows
    assert (sweep / "compare.png").read_bytes().startswith(PNG)
    with (sweep / "compare.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [row["runs"] for row in table] == ["2", "2"]
    # The table's numbers are the runs' own: the mean of each group's final eval/success.
    for row in table:
        lr = row["group"].split("=")[1]
        finals = []
        for job in sweep.iterdir():
            overrides = (job / ".hydra" / "overrides.yaml").read_text() if job.is_dir() else ""
            if f"pipeline.optimizer.lr={lr}" in overrides:
                records = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()]
                finals.append([r["eval/success"] for r in records if "eval/success" in r][-1])
        assert float(row["eval/success final mean"]) == pytest.approx(statistics.fmean(finals))


def test_groups_are_the_overrides_without_seed_and_without_what_all_share(tmp_path: Path) -> None:
    shared = ["+experiment=ppo_nav"]
    for i, (lr, seed, finals) in enumerate(
        [("1e-3", 1, [0.2, 0.5]), ("1e-3", 2, [0.4, 0.7]), ("3e-3", 1, [0.9, 0.6]),
         ("3e-3", 2, [0.3, 0.8])]
    ):  # fmt: skip
        points = [{"env_step": 100 * (k + 1), "eval/success": v} for k, v in enumerate(finals)]
        write_run(tmp_path / str(i), [*shared, f"seed={seed}", f"lr={lr}"], points)
    groups = group_runs([read_run(p) for p in find_runs([tmp_path])])
    assert [(g.label, [r.seed for r in g.runs]) for g in groups] == [
        ("lr=1e-3", ["1", "2"]),
        ("lr=3e-3", ["1", "2"]),
    ]
    assert main([str(tmp_path), "--metrics", "eval/success"]) == 0
    with (tmp_path / "compare.csv").open() as f:
        table = {row["group"]: row for row in csv.DictReader(f)}
    lr3 = table["lr=3e-3"]
    assert float(lr3["eval/success final mean"]) == pytest.approx(0.7)  # 0.6, 0.8
    assert float(lr3["eval/success final std"]) == pytest.approx(statistics.stdev([0.6, 0.8]))
    assert float(lr3["eval/success best mean"]) == pytest.approx(0.85)  # 0.9, 0.8
    assert (tmp_path / "compare.png").read_bytes().startswith(PNG)


def test_run_folders_are_read_as_untrusted(tmp_path: Path) -> None:
    """Links are not followed, non-numbers and broken lines are skipped, nothing is executed."""
    run = write_run(tmp_path / "runs" / "0", ["seed=1", "!!python/object/apply:os.system [x]"], [])
    (run / "metrics.jsonl").write_text(
        '{"env_step": 1, "eval/success": 0.5}\n'
        "not json\n"
        '{"env_step": 2, "eval/success": "0.9", "flag": true, "nan": NaN}\n'
        "[1, 2]\n"
    )
    (run / ".hydra" / "overrides.yaml").write_text("!!python/object/apply:os.system ['exit 3']")
    outside = write_run(tmp_path / "outside", ["seed=9"], [{"env_step": 1, "eval/success": 1.0}])
    (tmp_path / "runs" / "linked").symlink_to(outside, target_is_directory=True)
    assert find_runs([tmp_path / "runs"]) == [run]
    read = read_run(run)
    assert read.overrides == []  # (an unsafe YAML tag is not loaded)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["lr=\x1b]0;title\x07\x1b[2J"]))
    assert read_run(run).overrides == ["lr=\\x1b]0;title\\x07\\x1b[2J"]  # never acted on
    assert read.points == [{"env_step": 1.0, "eval/success": 0.5}, {"env_step": 2.0}]
    assert read.final("eval/success") == 0.5


def test_metrics_files_are_read_in_bounded_memory(
    tmp_path: Path, capsys, caplog, monkeypatch
) -> None:
    """Only the compared metrics are kept, integers of thousands of digits are skipped, and the
    points of one file and of all runs together are capped (hard links make many runs of one
    file: their total, not each file, is what fills memory)."""
    from rl.evaluation import compare, report

    points = [{"env_step": i, "eval/success": 0.5, "other": 1.0} for i in range(5)]
    run = write_run(tmp_path / "runs" / "0", ["seed=1"], points)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"env_step": 9, "eval/success": ' + "1" * 5_000 + "}\n")  # json refuses it
        f.write('{"env_step": 9, "eval/success": ' + "1" * 400 + "}\n")  # beyond a float
        f.write('{"env_step": 9, "eval/success": 1.7e308}\n')  # its mean would overflow
    assert (
        read_run(run, {"env_step", "eval/success"}).points
        == [{"env_step": float(i), "eval/success": 0.5} for i in range(5)]
        + [{"env_step": 9.0}] * 2
    )
    assert len(report.read_metrics(run / "metrics.jsonl", max_points=3)) == 3
    assert "more than 3 log points; the rest is ignored" in caplog.text
    for job in ("1", "2", "\u00b2_x"):  # (a superscript two is a digit to str.isdigit only)
        (tmp_path / "runs" / job).mkdir()
        os.link(run / "metrics.jsonl", tmp_path / "runs" / job / "metrics.jsonl")
    assert main([str(tmp_path / "runs")]) == 0
    monkeypatch.setattr(compare, "MAX_POINTS", 15)
    with pytest.raises(SystemExit):
        main([str(tmp_path / "runs")])
    assert "more than 15 log points in all; compare fewer runs" in capsys.readouterr().err


def test_no_run_is_a_clear_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "no run folder (one holding metrics.jsonl)" in capsys.readouterr().err


def test_a_folder_where_the_table_goes_is_one_line(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    write_run(runs / "0", ["seed=1"], [{"env_step": 1, "eval/success": 0.5}])
    write_run(runs / "1", ["seed=2"], [{"env_step": 1, "eval/success": 0.7}])
    (runs / "compare.csv").mkdir()
    assert main([str(runs)]) == 1
    err = capsys.readouterr().err
    assert (
        err.strip()
        == f"error: {runs / 'compare.csv'} is a folder where the run writes a file; refused"
    )


def test_a_folder_it_may_not_read_is_skipped_and_named(tmp_path: Path) -> None:
    """As a user whom permission bits stop (root runs without the capability to pass them)."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("as root, permission bits need setpriv to apply")
    user = (
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    )
    runs = tmp_path / "runs"
    write_run(runs / "0", ["seed=1"], [{"env_step": 1, "eval/success": 0.5}])
    write_run(runs / "zz", ["seed=2"], [{"env_step": 1, "eval/success": 0.7}])
    os.chmod(runs / "zz", 0)
    try:
        proc = subprocess.run(
            [*user, sys.executable, "-m", "rl.compare", str(runs), "--out", str(tmp_path)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.chmod(runs / "zz", 0o755)
    assert proc.returncode == 0, proc.stderr
    assert f"skipping {runs / 'zz'}: Permission denied" in proc.stderr
    assert "1 runs in 1 groups" in proc.stdout
