"""Helpers shared by the command-line tests."""

from __future__ import annotations

import json
import math

from recurrl.trainers.cli import build_parser, config_from_args, main
from recurrl.trainers.config import TrainConfig
from recurrl.trainers.logger import read_metrics

#: metrics that depend on wall time (excluded when runs are compared)
TIMING = {"fps", "fps_mean", "time_s"}


def parse_train(*argv: str) -> TrainConfig:
    """The resolved config of ``recurrl train *argv``."""
    return config_from_args(build_parser().parse_args(["train", *argv]))


def run_cli(capsys, *argv: str) -> list[str]:
    """Run ``recurrl *argv``, assert success, return the printed lines."""
    assert main(list(argv)) == 0
    return capsys.readouterr().out.strip().splitlines()


def metric_numbers(run_dir) -> list[dict[str, str]]:
    """``metrics.csv`` rows without the timing columns."""
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run_dir)]


class StopAfterBatches:
    """A stop request (``is_set()``, as a :class:`threading.Event`) that comes during the
    ``n``-th batch, as a Ctrl-C would."""

    def __init__(self, n: int) -> None:
        self.asked, self.n = 0, n

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked >= self.n


def check_resume_replays(
    capsys, tmp_path, argv: list[str], trainer_cls, stop_after: int | None = None,
    stop: StopAfterBatches | None = None,
) -> None:  # fmt: skip
    """Train ``argv`` uninterrupted, and again stopped after the checkpoint at ``stop_after``
    frames (or by ``stop``) then ``recurrl train --resume --trust-checkpoint`` (the
    simulators saved with ``--save-simulator``): both runs must log the same numbers."""
    argv = [*argv, "--save-simulator"]
    run_cli(capsys, "train", *argv, "--run-dir", str(tmp_path / "full"))
    cfg = parse_train(*argv, "--run-dir", str(tmp_path / "cut"))
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "config.json").write_text(json.dumps(cfg.to_dict()))
    trainer_cls(cfg).train(stop_after=stop_after, stop=stop)
    assert len(read_metrics(tmp_path / "cut")) == 2
    lines = run_cli(capsys, "train", "--resume", str(tmp_path / "cut"), "--trust-checkpoint")
    assert lines[-1] == str(tmp_path / "cut")
    assert metric_numbers(tmp_path / "cut") == metric_numbers(tmp_path / "full")


def train_tiny_lstm(capsys, run_dir, tiny: list[str]) -> list[dict[str, str]]:
    """``recurrl train *tiny --memory lstm`` into ``run_dir`` (two batches of 128 frames):
    checks the printed run directory, the metrics rows and the checkpoint; returns the rows."""
    lines = run_cli(capsys, "train", *tiny, "--memory", "lstm", "--run-dir", str(run_dir))
    assert lines[-1] == str(run_dir)
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [128, 256]
    assert all(math.isfinite(float(r["entropy"])) for r in rows)
    assert (run_dir / "checkpoint.pt").is_file()
    return rows
