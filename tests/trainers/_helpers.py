"""Helpers shared by the command-line tests."""

from __future__ import annotations

from recurrl.trainers.cli import build_parser, config_from_args, main
from recurrl.trainers.config import TrainConfig
from recurrl.trainers.logger import read_metrics

#: metrics that depend on wall time (excluded when runs are compared)
TIMING = {"fps", "time_s"}


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
