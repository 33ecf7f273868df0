"""The ``recurrl`` command: ``recurrl train`` and ``recurrl eval``.

The ``train`` options are generated from the config dataclasses of
:mod:`recurrl.trainers.config` (one option per field, its docstring as help); the command
only builds a :class:`~recurrl.trainers.config.TrainConfig` from them, saves it as
``run_dir/config.json`` and runs the recipe.

Examples:
    >>> parser = build_parser()
    >>> args = parser.parse_args(["train", "--memory", "gru", "--frames", "2000"])
    >>> cfg = config_from_args(args)
    >>> cfg.model.memory, cfg.ppo.frames, cfg.env.env
    ('gru', 2000, 'CartPole-masked')
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recurrl.trainers.config import ALGOS, SECTIONS, TrainConfig, field_docs
from recurrl.trainers.errors import UsageError
from recurrl.trainers.evaluate import CONFIG, evaluate, load_config

__all__ = ["build_parser", "config_from_args", "main"]

#: extra spellings of some options
ALIASES: dict[str, list[str]] = {"num_layers": ["--layers"]}
_SEP = "."  # argparse dest of a field: "<section>.<field>"
# dest section of an option every algorithm has (--frames, --lr): filled in the --algo section
_ALGO = "@algo"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_optional(kind: type) -> Any:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse


def _argument(hint: Any, default: Any) -> dict[str, Any]:
    """argparse keyword arguments for a field annotated ``hint``."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return {"choices": list(typing.get_args(hint)), "metavar": "{" + ",".join(
            typing.get_args(hint)) + "}"}  # fmt: skip
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin in (typing.Union, types.UnionType):
        kind = next(a for a in typing.get_args(hint) if a is not type(None))
        return {"type": _parse_optional(kind), "metavar": kind.__name__.upper()}
    return {"type": hint, "metavar": hint.__name__.upper()}


def _add_fields(
    group: argparse._ArgumentGroup, cls: type, section: str | None,
    added: dict[str, argparse.Action],
) -> None:  # fmt: skip
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    defaults = cls() if section is None else SECTIONS[section]()
    for f in dataclasses.fields(cls):
        if section is None and f.name in SECTIONS:
            continue  # the nested sections get their own groups
        default = getattr(defaults, f.name)
        shown = "on" if default is True else "off" if default is False else default
        flag = _flag(f.name)
        if flag in added:  # shared by the algorithms: one option, its default per algorithm
            added[flag].help = f"{added[flag].help[:-1]}; {section}: {shown})"
            continue
        kwargs = _argument(hints[f.name], default)
        shared = section in ALGOS and any(
            f.name in {g.name for g in dataclasses.fields(SECTIONS[a])}
            for a in ALGOS if a != section
        )  # fmt: skip
        where = f"{section} " if section in ALGOS else ""
        dest = f.name if section is None else f"{_ALGO if shared else section}{_SEP}{f.name}"
        added[flag] = group.add_argument(
            flag, *ALIASES.get(f.name, []), dest=dest, default=argparse.SUPPRESS,
            help=f"{docs.get(f.name, '')} ({where}default: {shown})", **kwargs,
        )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The ``recurrl`` argument parser (``train`` and ``eval`` subcommands)."""
    parser = argparse.ArgumentParser(
        prog="recurrl", description="Train and evaluate recurrent RL policies."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,eval}")
    train = sub.add_parser(
        "train",
        help="train a policy (default: PPO + LSTM on CartPole-masked; --algo dqn for DQN)",
        description="Train a policy. The resolved config is saved as RUN_DIR/config.json and "
        "the run directory is printed on the last line.",
    )
    train.add_argument(
        "--resume", metavar="RUN_DIR", default=None,
        help="continue the run in RUN_DIR from its checkpoint (its config.json, updated by "
        "the options given here, e.g. a larger --frames)",
    )  # fmt: skip
    train.add_argument(
        "--trust-checkpoint", action="store_true",
        help="with --resume: also restore the gymnasium simulators that a run trained with "
        "--save-simulator stored in its checkpoint, so the interrupted episodes continue and "
        "the run replays the uninterrupted one exactly. They are a pickle, which can run "
        "code: use only on a checkpoint you wrote or trust (default: off, new episodes)",
    )  # fmt: skip
    added: dict[str, argparse.Action] = {}
    _add_fields(train.add_argument_group("algorithm"), TrainConfig, None, added)
    for name, cls in SECTIONS.items():
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        _add_fields(train.add_argument_group(name, doc), cls, name, added)
    ev = sub.add_parser(
        "eval",
        help="evaluate a trained run",
        description="Run K episodes with a run's checkpointed policy; the last line is "
        "'mean_return: <mean> ± <std> over <K> episodes'.",
    )
    ev.add_argument("run_dir", metavar="RUN_DIR", help="directory printed by `recurrl train`")
    ev.add_argument("--episodes", type=int, default=10, help="episodes (default: 10)")
    ev.add_argument("--seed", type=int, default=None, help="seed (default: the run's seed + 1)")
    ev.add_argument(
        "--sample", action="store_true", help="sample actions instead of the most likely one"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` of parsed ``train`` arguments.

    Starts from the defaults (or, with ``--resume``, from the run's ``config.json``) and
    applies the options given on the command line.
    """
    resume = getattr(args, "resume", None)
    data = load_config(resume).to_dict() if resume else TrainConfig().to_dict()
    options = vars(args)
    algo = options.get("algo", data["algo"])
    if resume and algo != data["algo"]:
        raise ValueError(
            f"--algo {algo} differs from the {data['algo']} run in {resume}. Fix: drop --algo."
        )
    data["algo"] = algo
    for dest, value in options.items():
        if dest in ("command", "resume", "trust_checkpoint", "algo"):
            continue
        section, _, name = dest.rpartition(_SEP)
        if section in ALGOS and section != algo:
            raise ValueError(
                f"{_flag(name)} is a {section} option, but the algorithm is {algo}. Fix: "
                f"--algo {section}, or drop {_flag(name)}."
            )
        section = algo if section == _ALGO else section
        (data[section] if section else data)[name] = value
    if resume:
        given = data["run"]["run_dir"]
        if given is not None and Path(given).resolve() != Path(resume).resolve():
            raise ValueError(
                f"--run-dir {given} differs from --resume {resume}: a resumed run continues in "
                f"its own directory. Fix: drop --run-dir."
            )
        data["run"]["run_dir"] = str(resume)
    return TrainConfig.from_dict(data)


def _default_run_dir(cfg: TrainConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    algo = "" if cfg.algo == "ppo" else f"{cfg.algo}-"  # PPO runs keep their historical names
    return str(Path("runs") / f"{cfg.env.env}-{algo}{cfg.model.memory}-s{cfg.run.seed}-{stamp}")


def _train(args: argparse.Namespace) -> int:
    from recurrl.trainers.checkpoint import CHECKPOINT
    from recurrl.trainers.dqn import train as train_dqn
    from recurrl.trainers.ppo import train as train_ppo

    if args.trust_checkpoint and not args.resume:
        raise UsageError(
            "--trust-checkpoint applies to a resumed run's checkpoint, but no --resume was "
            "given. Fix: add --resume RUN_DIR, or drop --trust-checkpoint."
        )
    cfg = config_from_args(args)
    if cfg.run.run_dir is None:
        cfg.run.run_dir = _default_run_dir(cfg)
    run_dir = Path(cfg.run.run_dir)
    if not args.resume and (run_dir / CHECKPOINT).exists():
        raise ValueError(
            f"{run_dir} already holds a run. Fix: --resume {run_dir} to continue it, or "
            f"another --run-dir."
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    train = train_dqn if cfg.algo == "dqn" else train_ppo
    out = train(cfg, resume=bool(args.resume), trust_checkpoint=args.trust_checkpoint)
    print(out)
    return 0


def _eval(args: argparse.Namespace) -> int:
    returns = evaluate(
        args.run_dir, episodes=args.episodes, seed=args.seed, deterministic=not args.sample
    )
    mean = statistics.fmean(returns)
    std = statistics.pstdev(returns)
    print(f"mean_return: {mean:.2f} ± {std:.2f} over {len(returns)} episodes")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``recurrl`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _train(args) if args.command == "train" else _eval(args)
    except (ValueError, FileNotFoundError) as err:
        # configuration mistakes: usage + message, exit status 2 (argparse's convention)
        sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
        sub.error(str(err))
    return 2  # pragma: no cover (error() exits)


if __name__ == "__main__":
    sys.exit(main())
