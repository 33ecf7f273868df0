"""The `recurrl` command: parsing, --help, errors, and tiny train / resume / eval runs."""

from __future__ import annotations

import json
import re

import pytest

from recurrl.trainers import PPOTrainer, load_config
from recurrl.trainers.cli import main
from recurrl.trainers.logger import read_metrics

from ._helpers import check_resume_replays, metric_numbers, parse_train, run_cli

# 2 envs x 64 steps per batch, 2 batches: about a second per run
TINY = [
    "--num-envs", "2", "--frames", "256", "--frames-per-batch", "128",
    "--num-minibatches", "2", "--epochs", "2", "--hidden-size", "8", "--quiet",
]  # fmt: skip


def test_defaults_are_ppo_lstm_on_masked_cartpole():
    cfg = parse_train()
    assert (cfg.algo, cfg.model.memory, cfg.env.env) == ("ppo", "lstm", "CartPole-masked")
    assert cfg.run.run_dir is None


def test_options_map_to_fields():
    cfg = parse_train(
        "--memory", "gru", "--hidden-size", "16", "--layers", "2", "--seed", "5",
        "--num-envs", "4", "--frames", "4000", "--no-anneal-lr", "--max-episode-steps", "50",
    )  # fmt: skip
    assert (cfg.model.memory, cfg.model.hidden_size, cfg.model.num_layers) == ("gru", 16, 2)
    assert (cfg.run.seed, cfg.env.num_envs, cfg.ppo.frames) == (5, 4, 4000)
    assert cfg.ppo.anneal_lr is False and cfg.env.max_episode_steps == 50


def test_optional_schedule_ends_accept_none():
    cfg = parse_train("--clip-epsilon-end", "none", "--entropy-coef-end", "0.002")
    assert cfg.ppo.clip_epsilon_end is None and cfg.ppo.entropy_coef_end == 0.002
    assert parse_train("--clip-epsilon-end", "0.1").ppo.clip_epsilon_end == 0.1


def test_help_shows_field_docstrings(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--memory {lstm,gru,none}" in out
    assert "a feed-forward MLP baseline without memory" in out
    assert "--resume RUN_DIR" in out


def test_bad_choice_and_bad_config_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--memory", "transformer"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["train", "--frames", "1500"])
    assert info.value.code == 2
    assert "Fix: --frames 2000" in capsys.readouterr().err


def test_tiny_train_writes_the_run_and_prints_its_dir_last(tmp_path, capsys):
    run_dir = tmp_path / "run"
    lines = run_cli(capsys, "train", *TINY, "--run-dir", str(run_dir), "--checkpoint-every", "128")
    assert lines[-1] == str(run_dir)
    assert {"config.json", "metrics.csv", "checkpoint.pt"} <= {p.name for p in run_dir.iterdir()}
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["run"]["run_dir"] == str(run_dir) and saved["ppo"]["frames"] == 256
    assert load_config(run_dir).env.num_envs == 2
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [128, 256]
    assert {"episode_return", "loss_objective", "entropy", "fps"} <= set(rows[0])
    # a second train into the same directory must not overwrite it
    with pytest.raises(SystemExit):
        main(["train", *TINY, "--run-dir", str(run_dir)])


def test_same_seed_same_numbers(tmp_path, capsys):
    run_cli(capsys, "train", *TINY, "--run-dir", str(tmp_path / "a"))
    run_cli(capsys, "train", *TINY, "--run-dir", str(tmp_path / "b"))
    run_cli(capsys, "train", *TINY, "--run-dir", str(tmp_path / "c"), "--seed", "1")
    a, b, c = (metric_numbers(tmp_path / n) for n in "abc")
    assert a == b
    assert a != c


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--memory", "gru", "--slice-len", "16", "--num-minibatches", "4"],
        ["--memory", "none"],
        ["--shared-trunk"],
        ["--clip-epsilon-end", "0.05"],  # the clip range schedule resumes where it was
    ],
)
def test_resume_replays_the_uninterrupted_run(tmp_path, capsys, extra):
    argv = [*TINY, "--frames", "512", "--checkpoint-every", "256", *extra]
    check_resume_replays(capsys, tmp_path, argv, PPOTrainer, stop_after=256)


def test_resume_with_more_frames_continues(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *TINY, "--run-dir", str(run_dir))
    run_cli(capsys, "train", "--resume", str(run_dir), "--frames", "384")
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256, 384]
    assert load_config(run_dir).ppo.frames == 384
    with pytest.raises(SystemExit):
        main(["train", "--resume", str(tmp_path / "missing")])


def test_eval_prints_mean_and_std(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *TINY, "--max-episode-steps", "30", "--run-dir", str(run_dir))
    lines = run_cli(capsys, "eval", str(run_dir), "--episodes", "3")
    match = re.fullmatch(r"mean_return: (\d+\.\d\d) ± (\d+\.\d\d) over 3 episodes", lines[-1])
    assert match, lines[-1]
    assert 0 < float(match.group(1)) <= 30  # returns capped by max_episode_steps
    assert run_cli(capsys, "eval", str(run_dir), "--episodes", "3")[-1] == lines[-1]


def test_optional_outputs_are_skipped_with_a_note_or_written(tmp_path, capsys):
    run_dir = tmp_path / "run"
    lines = run_cli(capsys, "train", *TINY, "--run-dir", str(run_dir))
    names = {p.name for p in run_dir.iterdir()}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "note: matplotlib is not installed; no learning-curve plot." in lines
    else:
        assert "learning_curve.png" in names
    assert lines[-1] == str(run_dir)
