from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from recurrl.trainers.cli import build_parser, main
from recurrl.trainers.errors import UsageError
from recurrl.trainers.evaluate import load_config
from recurrl.trainers.logger import read_metrics
from recurrl.trainers.sweep import (
    EVAL_FILE,
    _markdown,
    _plan,
    _stop,
    parse_seeds,
    split_train_argv,
)

from ._helpers import parse_train

pytest.importorskip("scipy")

# tiny runs (as TINY in test_checkpoint.py): a run is a few seconds
TINY = [
    "--num-envs", "2", "--frames", "256", "--frames-per-batch", "128", "--num-minibatches", "2",
    "--epochs", "2", "--hidden-size", "8", "--quiet", "--no-plot", "--no-tensorboard",
    "--max-episode-steps", "30", "--recurrent-backend", "pad",  # runs named pad-s<seed>
]  # fmt: skip


def _sweep(out, *options: str, train=TINY) -> list[str]:
    return ["sweep", "--out", str(out), "--jobs", "2", *options, "--", *train]


def _mtimes(out) -> dict[str, float]:
    return {
        p.relative_to(out).as_posix(): p.stat().st_mtime_ns
        for p in out.glob("*/*")
        if p.name in ("checkpoint.pt", "metrics.csv", EVAL_FILE)
    }


def test_parse_seeds():
    assert parse_seeds(["0-3"]) == [0, 1, 2, 3]
    assert parse_seeds(["0", "1", "2"]) == [0, 1, 2]
    assert parse_seeds(["5,1-2", "2", "7-7"]) == [5, 1, 2, 7]
    for bad in (["3-1"], ["a"], ["-1"], ["1-"]):
        with pytest.raises(UsageError, match="--seeds"):
            parse_seeds(bad)


def test_split_train_argv():
    assert split_train_argv(["sweep", "--seeds", "0", "--", "--frames", "9"]) == (
        ["sweep", "--seeds", "0"], ["--frames", "9"]
    )  # fmt: skip
    assert split_train_argv(["sweep"]) == (["sweep"], [])


def test_plan_runs_every_seed_under_each_backend(tmp_path):
    args = build_parser().parse_args(
        ["sweep", "--seeds", "0-1", "--backends", "pad", "scan", "--out", str(tmp_path)]
    )
    out, runs = _plan(args, ["--memory", "gru", "--frames", "2000"])
    assert out == tmp_path
    assert [r.name for r in runs] == ["pad-s0", "pad-s1", "scan-s0", "scan-s1"]
    assert all(r.state == "new" and r.frames == 2000 for r in runs)
    cfg = parse_train(*runs[3].train_argv)
    assert (cfg.model.recurrent_backend, cfg.run.seed, cfg.model.memory) == ("scan", 1, "gru")
    assert (cfg.run.num_threads, cfg.run.eval_episodes) == (1, 0)
    # default out: named after the configuration, so the same command finds it again
    args = build_parser().parse_args(["sweep", "--seeds", "3"])
    out, runs = _plan(args, ["--algo", "dqn"])
    assert out.as_posix() == "sweeps/CartPole-masked-dqn-lstm"
    assert [r.name for r in runs] == ["auto-s3"]  # the train default, --recurrent-backend auto


@pytest.mark.parametrize(
    ("env", "given", "expected"),
    [
        ("CartPole-masked", None, 450.0),
        ("popgym-RepeatPreviousEasy-v0", None, 0.8),
        ("minigrid:MiniGrid-MemoryS7-v0", None, 0.9),
        ("vmas:simple_spread", None, None),  # no known return range: no success rate
        ("vmas:simple_spread", "-300", -300.0),
    ],
)
def test_the_success_level_is_the_task_familys_unless_given(tmp_path, env, given, expected):
    argv = ["sweep", "--seeds", "0", "--out", str(tmp_path)]
    args = build_parser().parse_args(argv + (["--threshold", given] if given else []))
    _plan(args, ["--env", env])
    if expected is None:
        assert args.threshold is None
    else:
        assert args.threshold == pytest.approx(expected)


def test_a_summary_without_a_success_level_says_so():
    summary = {"train_options": ["--env", "vmas:simple_spread"], "seeds": [0], "threshold": None,
               "eval_episodes": 2, "runs": [], "missing": [], "plot": None, "note": None,
               "per_backend": {"auto": {"runs": 1, "eval": {"iqm": -400.0, "ci_low": -410.0,
               "ci_high": -390.0, "mean": -400.0, "median": -400.0, "success_rate": None},
               "train": None}}}  # fmt: skip
    text = _markdown(summary)
    assert (
        "no success level" in text
        and "| auto | 1 | -400.0 | -400.0 | -400.0 [-410.0, -390.0] | - |" in text
    )


@pytest.mark.parametrize(
    ("options", "train", "message"),
    [
        ([], ["--seed", "3"], "sets --seed of every run itself"),
        ([], ["--run-dir", "x"], "sets --run-dir"),
        (["--backends", "pad"], ["--recurrent-backend", "scan"], "both set the recurrent"),
        (["--jobs", "0"], [], "--jobs must be >= 1"),
        (["--seeds", "4-2"], [], "--seeds"),
    ],
)
def test_usage_errors(tmp_path, capsys, options, train, message):
    assert main(_sweep(tmp_path / "out", *options, train=train)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # subprocess runs of recurrl train
def test_tiny_sweep_end_to_end_then_a_rerun_does_only_what_is_missing(tmp_path, capsys):
    out = tmp_path / "out"
    argv = _sweep(out, "--seeds", "0-1", "--eval-episodes", "2", "--threshold", "15")
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "pad-s0: training" in stdout and "pad-s1: finished" in stdout
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["runs"]
    assert [(r["backend"], r["seed"], r["state"]) for r in runs] == [
        ("pad", 0, "done"), ("pad", 1, "done")
    ]  # fmt: skip
    for r in runs:
        assert len(r["eval_returns"]) == 2
        assert r["eval_mean"] == pytest.approx(sum(r["eval_returns"]) / 2)
        rows = read_metrics(r["run_dir"])
        assert int(rows[-1]["frames"]) == 256
        assert r["final_train_return"] == pytest.approx(float(rows[-1]["recent_return"]))
        cfg = load_config(r["run_dir"])
        assert (cfg.run.seed, cfg.model.hidden_size) == (r["seed"], 8)
    evals = [r["eval_mean"] for r in runs]
    stats = summary["per_backend"]["pad"]["eval"]
    assert stats["n"] == 2 and stats["mean"] == pytest.approx(sum(evals) / 2)
    assert stats["ci_low"] <= stats["iqm"] <= stats["ci_high"]
    assert stats["success_rate"] == sum(e >= 15 for e in evals) / 2
    assert summary["missing"] == [] and summary["threshold"] == 15
    md = (out / "summary.md").read_text()
    assert "| pad | 2 |" in md and "interquartile mean" in md and "| pad-s1 | 1 | done |" in md
    assert summary["plot"] == "returns.png" or "matplotlib" in summary["note"]

    # the same command again: nothing to train or evaluate
    before = _mtimes(out)
    assert main(argv) == 0
    assert "pad-s0: done, skipped" in capsys.readouterr().out
    assert _mtimes(out) == before
    # a lost evaluation: only that one runs again
    (out / "pad-s1" / EVAL_FILE).unlink()
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "pad-s0: done, skipped" in stdout and "pad-s1: evaluating" in stdout
    after = _mtimes(out)
    assert (out / "pad-s1" / EVAL_FILE).exists()
    assert {k: v for k, v in after.items() if k != f"pad-s1/{EVAL_FILE}"} == {
        k: v for k, v in before.items() if k != f"pad-s1/{EVAL_FILE}"
    }


@pytest.mark.slow  # subprocess runs of recurrl train
def test_an_unfinished_run_is_resumed_and_a_failing_run_reported(tmp_path, capsys):
    out = tmp_path / "out"
    argv = _sweep(out, "--seeds", "0-1", "--eval-episodes", "0")

    # seed 0 stopped after its first batch (as if interrupted): 128 of 256 frames
    def half(seed: int) -> list[str]:
        return [
            "train", *TINY, "--frames", "128", "--seed", str(seed), "--recurrent-backend", "pad",
            "--eval-episodes", "0", "--run-dir", str(out / f"pad-s{seed}"),
        ]  # fmt: skip

    assert main(half(0)) == 0
    first_row = read_metrics(out / "pad-s0")[0]
    # seed 1: a run whose checkpoint is damaged: its resume fails
    assert main(half(1)) == 0
    (out / "pad-s1" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    capsys.readouterr()

    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "pad-s0: resuming" in captured.out
    rows = read_metrics(out / "pad-s0")
    assert [r["frames"] for r in rows] == ["128", "256"]
    assert rows[0] == first_row  # the first batch was not trained again
    assert "resuming" in (out / "logs" / "pad-s0.out").read_text()
    assert "pad-s1 (seed 1, backend pad) failed with exit status 2" in captured.err
    assert "checkpoint" in captured.err.split("failed", 1)[1]  # its stderr tail
    assert "1 run(s) failed: seed 1 (pad)" in captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert [r["state"] for r in summary["runs"]] == ["done", "failed"]
    assert summary["runs"][1]["error"].startswith("exit status 2")
    assert summary["missing"] == ["pad-s1 (failed)"]
    assert summary["per_backend"]["pad"]["runs"] == 1
    assert "Missing: pad-s1 (failed)" in (out / "summary.md").read_text()


def test_a_run_dir_of_another_configuration_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    run_dir = out / "pad-s0"
    run_dir.mkdir(parents=True)
    other = parse_train(*TINY, "--hidden-size", "16", "--run-dir", str(run_dir))
    (run_dir / "config.json").write_text(json.dumps(other.to_dict()))
    assert main(_sweep(out, "--seeds", "0")) == 2
    err = capsys.readouterr().err
    assert str(run_dir) in err and "another configuration" in err
    assert "model.hidden_size: the run has 16, the sweep 8" in err
    assert not (out / "summary.json").exists()


def test_stop_interrupts_children_and_kills_them_after_the_grace_time():
    code = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"  # noqa: E501
    stubborn = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    polite = subprocess.Popen(
        [sys.executable, "-c", "import time; print(1, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    for p in (stubborn, polite):
        p.stdout.readline()  # started (and the handler installed)
    start = time.monotonic()
    _stop([stubborn, polite], grace=1.0)
    assert time.monotonic() - start < 10
    assert polite.returncode != 0 and stubborn.returncode == -9


@pytest.mark.slow  # subprocess runs, signals
def test_ctrl_c_stops_the_runs_at_a_checkpoint_and_the_summary_lists_them(tmp_path):
    out = tmp_path / "out"
    long = [*TINY, "--frames", "128000", "--checkpoint-every", "128"]
    cmd = [sys.executable, "-m", "recurrl.trainers.cli", *_sweep(out, "--seeds", "0", train=long)]
    sweep = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "pad-s0" / "metrics.csv"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and read_metrics(out / "pad-s0")):  # training has started
        assert time.monotonic() < deadline and sweep.poll() is None
        time.sleep(0.2)
    sweep.send_signal(signal.SIGINT)
    _, err = sweep.communicate(timeout=90)
    assert sweep.returncode == 130, err
    assert "stopping 1 run(s) at their next checkpoint" in err and "pad-s0 (interrupted)" in err
    assert "checkpoint saved" in (out / "logs" / "pad-s0.err").read_text()
    frames = int(read_metrics(out / "pad-s0")[-1]["frames"])
    assert 128 <= frames < 128000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["missing"] == ["pad-s0 (interrupted)"]
    args = build_parser().parse_args(_sweep(out, "--seeds", "0")[: -1 - len(TINY)])
    assert [r.state for r in _plan(args, long)[1]] == ["resume"]  # a rerun continues it


def test_ray_runs_the_seeds_as_ray_tasks(tmp_path, capsys, ray_session):
    out = tmp_path / "out"
    assert main(_sweep(out, "--seeds", "0-1", "--ray", "--eval-episodes", "1")) == 0
    stdout = capsys.readouterr().out
    assert "pad-s0: submitted (new)" in stdout and "pad-s1: finished" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [r["state"] for r in summary["runs"]] == ["done", "done"]
    assert all(len(r["eval_returns"]) == 1 for r in summary["runs"])
    assert ray_session.is_initialized()  # the session it found is left to its owner
    assert main(_sweep(out, "--seeds", "0-1", "--ray", "--eval-episodes", "1")) == 0
    assert "pad-s1: done, skipped" in capsys.readouterr().out


def test_ray_without_the_extra_names_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(_sweep(tmp_path / "out", "--seeds", "0", "--ray")) == 2
    assert 'pip install "recurrl[ray]"' in capsys.readouterr().err
