"""`recurrl bench`: MMER, the aggregate, the report, resumption and refused input.

The fast tests give the bench run directories made by hand (config, checkpoint, metrics and
greedy returns as a finished run leaves them), so every number of the report is known; one
slow test trains the tiny two-task suite for real.
"""

from __future__ import annotations

import json
import math

import pytest

from recurrl.trainers.bench import BENCH_OPTIONS, _plan_cells, _suite, aggregate, mmer, run_mmer
from recurrl.trainers.cli import build_parser, main
from recurrl.trainers.logger import MetricsLogger
from recurrl.trainers.sweep import EVAL_FILE, _commands

from ._helpers import parse_train

pytest.importorskip("scipy")

NAN = float("nan")
#: Pendulum-masked's return range (its normalized score): [-H, 0]
H = 200 * 16.2736044


def _bench(out, *options: str) -> list[str]:
    return ["bench", "--tasks", "CartPole-masked", "Pendulum-masked", "--memory", "gru", "none",
            "--frames", "2000", "--eval-episodes", "2", "--out", str(out), *options]  # fmt: skip


def _fake_run(out, task, memory, seed, batch_returns, greedy, frames=2000):
    """A run directory as `recurrl sweep` leaves a finished (or interrupted) run: one
    1000-frame batch per entry of ``batch_returns``, greedy returns evaluated when given."""
    run_dir = out / task / memory / f"auto-s{seed}"
    argv = ["--env", task, "--memory", memory, "--frames", str(frames), *BENCH_OPTIONS,
            "--seed", str(seed), "--recurrent-backend", "auto", "--num-threads", "1",
            "--eval-episodes", "0", "--run-dir", str(run_dir)]  # fmt: skip
    cfg = parse_train(*argv)
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run_dir / "checkpoint.pt").write_bytes(b"")
    logger = MetricsLogger(run_dir, tensorboard=False)
    for i, value in enumerate(batch_returns):
        logger.log({"frames": 1000 * (i + 1), "episode_return": value, "recent_return": value})
    if greedy is not None:
        (run_dir / EVAL_FILE).write_text(json.dumps(
            {"episodes": 2, "frames": frames, "returns": [greedy, greedy]}))  # fmt: skip
    return run_dir


def _fill(out) -> None:
    """Both tasks x both models x seeds 0-1, finished; MMERs and greedy returns chosen."""
    _fake_run(out, "CartPole-masked", "gru", 0, [100.0, 400.0], 500.0)  # MMER 400
    _fake_run(out, "CartPole-masked", "gru", 1, [NAN, 200.0], 450.0)  # MMER 200
    _fake_run(out, "CartPole-masked", "none", 0, [50.0, 25.0], 30.0)  # MMER 50
    _fake_run(out, "CartPole-masked", "none", 1, [150.0, NAN], 40.0)  # MMER 150
    _fake_run(out, "Pendulum-masked", "gru", 0, [-H, -H / 2], -H / 4)  # MMER -H/2: score 0.5
    _fake_run(out, "Pendulum-masked", "gru", 1, [-H / 2, -H], -H / 4)
    _fake_run(out, "Pendulum-masked", "none", 0, [-H, -H], -H)  # score 0
    _fake_run(out, "Pendulum-masked", "none", 1, [-H, -H], -H)


def test_mmer_is_the_last_value_of_the_running_maximum():
    assert mmer([0.1, -0.2, 0.4, 0.3]) == 0.4
    assert mmer([NAN, -0.5, NAN, -0.75]) == -0.5
    assert mmer([]) is None and mmer([NAN, NAN]) is None


def test_run_mmer_reads_the_batch_returns_of_metrics_csv(tmp_path):
    run_dir = _fake_run(tmp_path, "CartPole-masked", "gru", 0, [NAN, 12.5, 30.0, 20.0], None,
                        frames=4000)  # fmt: skip
    assert run_mmer(run_dir) == 30.0
    assert run_mmer(tmp_path / "missing") is None


def test_aggregate_point_estimate_and_a_hand_computed_bootstrap():
    scores = {"a": [0.0, 1.0], "b": [0.5]}
    # a resample of task a averages to 0, 0.5 or 1 (probabilities 1/4, 1/2, 1/4), task b is
    # always 0.5: the aggregate takes 0.25, 0.5 or 0.75, and its 95% percentile interval is
    # [0.25, 0.75] (each end has probability 1/4 > 2.5%)
    result = aggregate(scores, seed=3)
    assert result == {"mean": 0.5, "ci_low": 0.25, "ci_high": 0.75, "tasks": 2, "runs": 3}
    # unequal seeds: each task weighs the same (rliable's mean over a runs x tasks matrix when
    # the seeds are equal)
    assert aggregate({"a": [1.0, 1.0, 1.0, 0.0], "b": [0.0]})["mean"] == pytest.approx(0.375)
    result = aggregate({"a": [0.1, 0.9, 0.4], "b": [0.2, 0.3, 0.8]}, seed=0)
    assert result["mean"] == pytest.approx(0.45)
    assert result["ci_low"] < result["mean"] < result["ci_high"]
    assert aggregate({"a": [0.1, 0.9, 0.4], "b": [0.2, 0.3, 0.8]}, seed=0) == result  # seeded
    with pytest.raises(ValueError, match="at least one score per task"):
        aggregate({"a": []})


def test_the_report_end_to_end_from_finished_runs(tmp_path, capsys):
    out = tmp_path / "out"
    _fill(out)
    assert main(_bench(out, "--seeds", "0-1")) == 0
    stdout = capsys.readouterr().out
    assert stdout.count("done, skipped") == 8 and "training" not in stdout
    s = json.loads((out / "summary.json").read_text())
    cells = {(c["task"], c["memory"]): c for c in s["cells"]}
    assert cells["CartPole-masked", "gru"]["mmer"] == 300.0  # (400 + 200) / 2
    assert cells["CartPole-masked", "none"]["mmer"] == 100.0
    assert cells["Pendulum-masked", "gru"]["mmer"] == pytest.approx(-H / 2)
    assert cells["Pendulum-masked", "gru"]["score"] == pytest.approx(0.5)
    greedy = cells["CartPole-masked", "gru"]["greedy"]
    assert (greedy["iqm"], greedy["success_rate"]) == (475.0, 1.0)  # both >= 450
    assert cells["Pendulum-masked", "gru"]["greedy"]["success_rate"] == 0.0  # score 0.75
    # per model: the mean over tasks of the mean normalized MMER over seeds
    gru, none = s["aggregate"]["gru"]["score"], s["aggregate"]["none"]["score"]
    assert gru["mean"] == pytest.approx((300 / 500 + 0.5) / 2)
    assert none["mean"] == pytest.approx((100 / 500 + 0.0) / 2)
    assert gru["ci_low"] <= gru["mean"] <= gru["ci_high"] and (gru["tasks"], gru["runs"]) == (2, 4)
    assert s["aggregate"]["gru"]["greedy_score"]["mean"] == pytest.approx((475 / 500 + 0.75) / 2)
    report = (out / "report.md").read_text()
    assert "| gru | 0.55 [" in report and "| CartPole-masked | 2k | 300.00 | 100.00 |" in report
    assert s["memory_recipes"] == {} and "Memory models with a recipe" not in report
    # a memory with a recipe of its own is listed under the families' recipes
    from recurrl.trainers.bench_report import _report

    s["memory_recipes"] = {"transformer": {"options": ["--lr", "0.002"], "source": "a test"}}
    assert "| transformer | `--lr 0.002` | a test |" in _report(s)
    assert "MMER" in report and "rliable" in report and "--tasks CartPole-masked" in report
    if s["plots"]:  # matplotlib installed
        assert (out / s["plots"]["CartPole-masked"]).is_file()
        assert "![CartPole-masked](plots/CartPole-masked.png)" in report
    assert "| CartPole-masked | none | 2/2 | 100.000 |" in (out / "summary.md").read_text()
    # each cell is a sweep with its own summary
    assert json.loads((out / "CartPole-masked" / "gru" / "summary.json").read_text())["runs"]


def test_a_rerun_trains_nothing_and_an_interrupted_run_resumes(tmp_path):
    out = tmp_path / "out"
    _fill(out)
    # seed 2 of one cell stopped after its first batch; seed 2 elsewhere never started
    _fake_run(out, "CartPole-masked", "gru", 2, [10.0], None)
    args = build_parser().parse_args(_bench(out, "--seeds", "0-2"))
    cells = _plan_cells(args, [], _suite(args), ["gru", "none"], out)
    states = {(c.task, c.memory, r.seed): r.state for c in cells for r in c.runs}
    assert states["CartPole-masked", "gru", 2] == "resume"
    assert states["CartPole-masked", "none", 2] == "new"
    assert {s for (_, _, seed), s in states.items() if seed < 2} == {"done"}
    run = next(r for c in cells for r in c.runs if r.state == "resume")
    (train, evaluate) = _commands(run, 2)
    assert "--resume" in train and str(run.run_dir) in train and "--evaluate" in evaluate
    assert all(_commands(r, 2) == [] for c in cells for r in c.runs if r.state == "done")
    # every cell's sweep counts a success at its task family's level (90% of the range)
    levels = {c.task: c.sweep_args.threshold for c in cells}
    assert levels == {"CartPole-masked": 450.0, "Pendulum-masked": pytest.approx(-325.472088)}


def test_report_only_trains_nothing_and_lists_what_is_missing(tmp_path, capsys):
    out = tmp_path / "out"
    _fake_run(out, "CartPole-masked", "gru", 0, [100.0, 400.0], 500.0)
    assert main(_bench(out, "--seeds", "0", "--report-only")) == 0
    assert "training" not in capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    assert [c["mmer_runs"] for c in s["cells"]] == [1, 0, 0, 0]
    assert s["aggregate"]["none"]["score"] is None
    assert "no finished run" in (out / "report.md").read_text()
    assert not (out / "CartPole-masked" / "none" / "auto-s0").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "popgym-easyy"], "unknown suite 'popgym-easyy'. Fix: recurrl bench popgym-easy"),
        (["bench"], "no suite and no --tasks given. Fix:"),
        (["bench", "popgym-easy", "--tasks", "CartPole-masked"], "both given"),
        (["bench", "popgym-easy", "--memory", "gru", "lsmt"],
         "unknown memory model(s) ['lsmt']; expected some of ['lstm', 'gru'"),
        (["bench", "popgym-easy", "--memory", "lsmt"], "Fix: --memory gru none"),
        (["bench", "popgym-easy", "--", "--frames", "10"], "sets --frames of every cell"),
        (["bench", "popgym-easy", "--eval-episodes", "0"], "--eval-episodes must be >= 1"),
        (["bench", "popgym-easy", "--seeds", "3-1"], "--seeds"),
    ],
)
def test_bad_input_is_refused_with_the_choices_and_the_fix(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "out")] if "--" not in argv else
                [*argv[:2], "--out", str(tmp_path / "out"), *argv[2:]]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_run_dir_of_another_configuration_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    _fake_run(out, "CartPole-masked", "gru", 0, [1.0, 2.0], 1.0)
    assert main([*_bench(out, "--seeds", "0"), "--", "--hidden-size", "16"]) == 2
    err = capsys.readouterr().err
    assert "another configuration (model.hidden_size: the run has 64, the sweep 16)" in err
    assert not (out / "summary.json").exists()
    assert not (out / "Pendulum-masked").exists()  # nothing started


def test_help_lists_the_suites_and_the_memories(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "popgym-easy: popgym's 14 Easy tasks" in text and "minigrid-memory" in text
    from recurrl.modules.registry import memory_names

    assert f"{', '.join(memory_names())}, none (default: all of them)" in text  # the registry


@pytest.mark.slow  # eight subprocesses (four trainings, four evaluations)
def test_tiny_suite_trained_for_real(tmp_path, capsys):
    pytest.importorskip("popgym")
    out = tmp_path / "out"
    argv = ["bench", "--tasks", "popgym-RepeatPreviousEasy-v0", "CartPole-masked", "--memory",
            "gru", "none", "--frames", "2000", "--seeds", "0", "--eval-episodes", "2", "--jobs",
            "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.count(": finished") == 4
    s = json.loads((out / "summary.json").read_text())
    for cell in s["cells"]:
        assert cell["mmer_runs"] == 1 and math.isfinite(cell["mmer"])
        assert len(cell["runs"]) == 1 and cell["greedy"]["n"] == 1
    pop = next(c for c in s["cells"] if c["task"].startswith("popgym") and c["memory"] == "gru")
    assert -1.0 <= pop["mmer"] <= 1.0 and pop["score"] == pytest.approx((pop["mmer"] + 1) / 2)
    config = json.loads((out / "popgym-RepeatPreviousEasy-v0" / "gru" / "auto-s0" /
                         "config.json").read_text())  # fmt: skip
    assert (config["ppo"]["reward_scale"], config["ppo"]["obs_scale"]) == (1.0, 1.0)  # recipe
    assert (out / "report.md").is_file()
    assert main(argv) == 0  # the same command again: nothing to train or evaluate
    assert capsys.readouterr().out.count("done, skipped") == 4
