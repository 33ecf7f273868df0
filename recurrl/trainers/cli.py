"""The ``recurrl`` command: ``recurrl train``, ``eval``, ``sweep`` and ``bench``.

The ``train`` options are generated from the config dataclasses of
:mod:`recurrl.trainers.config` (one option per field, its docstring as help); the command
only builds a :class:`~recurrl.trainers.config.TrainConfig` from them, saves it as
``run_dir/config.json`` and runs the recipe.

Around the recipe it keeps runs safe from mistakes and interruptions: a
:class:`~recurrl.trainers.errors.UsageError` is one line and exit status 2 (anything else
is an internal error, with its traceback); a resume that does not fit its checkpoint is
refused before anything is written; SIGINT / SIGTERM end the run at a batch boundary with a
checkpoint; one process at a time holds a run directory
(:mod:`~recurrl.trainers.run_lock`). See ``docs/implementation_details.md``, section 14.

Examples:
    >>> parser = build_parser()
    >>> args = parser.parse_args(["train", "--memory", "gru", "--frames", "2000"])
    >>> cfg = config_from_args(args)
    >>> cfg.model.memory, cfg.ppo.frames, cfg.env.env
    ('gru', 2000, 'CartPole-masked')
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import logging
import os
import shlex
import shutil
import signal
import statistics
import sys
import threading
import time
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from recurrl.trainers.bench import add_bench_parser, run_bench
from recurrl.trainers.checkpoint import CHECKPOINT
from recurrl.trainers.config import (
    ALGOS,
    RESUMABLE,
    SECTIONS,
    EnvConfig,
    TrainConfig,
    field_docs,
    resume_conflicts,
)
from recurrl.trainers.errors import UsageError
from recurrl.trainers.evaluate import CONFIG, evaluate, load_config, require_checkpoint
from recurrl.trainers.export import add_export_parser, run_export
from recurrl.trainers.plugins import load_plugins
from recurrl.trainers.run_lock import lock_run_dir
from recurrl.trainers.suites import memory_recipe_for, recipe_for
from recurrl.trainers.supervisor import failure_report, in_child, kill_hook, supervise
from recurrl.trainers.sweep import add_sweep_parser, run_sweep, split_train_argv

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
        if "choices" in f.metadata:  # a registry's names, read when the parser is built
            names = list(f.metadata["choices"]())
            kwargs.update(choices=names, metavar="{" + ",".join(names) + "}")
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
    """The ``recurrl`` argument parser (its subcommands: ``train``, ``eval``, ``sweep``,
    ``bench``, ``build-ext`` and the others registered below)."""
    parser = argparse.ArgumentParser(
        prog="recurrl", description="Train and evaluate recurrent RL policies."
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{train,eval,sweep,bench,build-ext,export}"
    )
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
    ev.add_argument(
        "--engine", choices=typing.get_args(typing.get_type_hints(EnvConfig)["engine"]),
        default=None,
        help="what steps the evaluation envs (default: the run's own engine); the same task "
        "on another engine draws its random starts differently: gymnasium plays the "
        "episodes of gymnasium's env for the seed, as examples/deploy/run_onnx.py does",
    )  # fmt: skip
    add_sweep_parser(sub)
    add_bench_parser(sub)
    add_export_parser(sub)
    ext = sub.add_parser(
        "build-ext",
        help="compile the C++ kernels of --recurrent-backend cpp ahead of time",
        description="Compile recurrl's C++ kernels (otherwise compiled on first use, ~1 min) "
        "and print where they are cached ($RECURRL_EXT_DIR to choose).",
    )
    ext.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    return parser


def _build_ext(args: argparse.Namespace) -> int:
    from recurrl._ext.__main__ import main as build

    return build(["--verbose"] if args.verbose else [])


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` of parsed ``train`` arguments.

    Starts from the defaults (or, with ``--resume``, from the run's ``config.json``) and
    applies the options given on the command line.

    Raises:
        UsageError: an invalid option value, or (``--resume``) an option the run's stored
            state does not allow to change (:data:`~recurrl.trainers.config.RESUMABLE`).
        CheckpointError: the ``--resume`` directory holds no valid run.
    """
    resume = getattr(args, "resume", None)
    saved = load_config(resume).to_dict() if resume else None
    data = copy.deepcopy(saved) if saved else TrainConfig().to_dict()
    if not saved:
        data["env"]["num_envs"] = None  # the chosen algorithm's default unless given
        data["ppo"]["num_minibatches"] = None  # fitted to the batch's rows unless given
        for section in ALGOS:  # num_envs x steps_per_env unless given
            data[section]["frames_per_batch"] = None
        data["dqn"]["burn_in"] = None  # the sampler's default (slice: 10, tape: 0) unless given
        data["dqn"]["sampler"] = "auto"  # slice if a slice-only option is given, else tape
        data["dqn"]["priority_uniform_mix"] = None  # 0.5 with --prioritized, else 0
    options = vars(args)
    algo = options.get("algo", data["algo"])
    if saved and algo != saved["algo"]:  # before the merge: the sections would not fit
        raise UsageError(_conflict_message(resume, [("algo", saved["algo"], algo)]))
    data["algo"] = algo
    recipes = [] if saved else _recipe_defaults(options, data, algo)
    defaults = {k: v for _, taken in recipes for k, v in taken.items()}  # the memory's last
    options = {**defaults, **options}  # a resumed run keeps its saved (resolved) values
    top = {f.name for f in dataclasses.fields(TrainConfig)} - SECTIONS.keys()  # algo
    for dest, value in options.items():
        if dest in top:
            data[dest] = value
            continue
        if _SEP not in dest:  # an option of the command (--resume), not a config field
            continue
        section, _, name = dest.rpartition(_SEP)
        if section in ALGOS and section != algo:
            raise UsageError(
                f"{_flag(name)} is a {section} option, but the algorithm is {algo}. Fix: "
                f"--algo {section}, or drop {_flag(name)}."
            )
        data[algo if section == _ALGO else section][name] = value
    _ray_options(options, data)
    if resume:
        # where the run lies now: a moved or copied directory resumes in its new place
        given = options.get(f"run{_SEP}run_dir")
        if given is not None and Path(given).resolve() != Path(resume).resolve():
            raise UsageError(
                f"--run-dir {given} differs from --resume {resume}: a resumed run continues in "
                f"its own directory. Fix: drop --run-dir."
            )
        data["run"]["run_dir"] = str(resume)
        conflicts = resume_conflicts(saved, data)
        if conflicts:
            raise UsageError(_conflict_message(resume, conflicts))
    try:
        return TrainConfig.from_dict(data)
    except (TypeError, ValueError) as err:  # the config's own checks: the user's options
        note = "".join(f" (with {who}'s defaults: {_shown_all(taken)})" for who, taken in recipes)
        raise UsageError(f"{err}{note}") from err


def _recipe_defaults(
    options: dict[str, Any], data: dict[str, Any], algo: str
) -> list[tuple[str, dict[str, Any]]]:
    """The defaults a new run takes from recipes, as ``[(whose, {argparse dest: value})]``:
    the recipe of its env family (:func:`~recurrl.trainers.suites.recipe_for`), then that of
    its memory model (:func:`~recurrl.trainers.suites.memory_recipe_for`), each without the
    options the command line sets; the memory's win where both set one."""
    env_id = options.get(f"env{_SEP}env", data["env"]["env"])
    memory = options.get(f"model{_SEP}memory", data["model"]["memory"])
    found = []
    family, model = recipe_for(env_id), memory_recipe_for(memory)
    if family is not None:
        found.append((f"the {family.name} recipe", family.train_options(algo), "register_recipe"))
    if model is not None:
        found.append(
            (f"the {memory} memory recipe", model.train_options(algo), "register_memory_recipe")
        )
    taken = []
    for who, argv, register in found:
        if not argv:
            continue
        try:
            parsed = vars(build_parser().parse_args(["train", *argv]))
        except SystemExit as err:  # argparse printed what is wrong
            raise UsageError(
                f"{who}'s options {' '.join(argv)} are not valid `recurrl train` options "
                f"(above). Fix: correct its {register} call."
            ) from err
        chosen = {k: v for k, v in parsed.items() if _SEP in k and k not in options}
        if chosen:
            taken.append((who, chosen))
    return taken


def _shown_all(options: dict[str, Any]) -> str:
    return " ".join(_shown(k, v) for k, v in options.items())


def _say_recipe(args: argparse.Namespace, cfg: TrainConfig) -> None:
    """One line per recipe a new run took defaults from (its env family's, its memory's)."""
    data = {"env": {"env": cfg.env.env}, "model": {"memory": cfg.model.memory}}
    for who, taken in _recipe_defaults(vars(args), data, cfg.algo):
        subject = f"--memory {cfg.model.memory}" if " memory recipe" in who else cfg.env.env
        print(
            f"recurrl train: {subject} takes {who}'s defaults: {_shown_all(taken)} (options "
            f"given on the command line win)",
            file=sys.stderr, flush=True,
        )  # fmt: skip


def _ray_options(options: dict[str, Any], data: dict[str, Any]) -> None:
    """Options of the Ray collector given without it are a mistake, not ignored; a given
    ``--envs-per-worker`` without ``--num-envs`` sets the total number of envs."""
    env = data["env"]
    if env["collector"] != "ray":
        given = [n for n in ("workers", "envs_per_worker") if f"env{_SEP}{n}" in options]
        if given:
            flags = " ".join(_flag(n) for n in given)
            verb = "applies" if len(given) == 1 else "apply"
            raise UsageError(
                f"{flags} only {verb} with --collector ray (the run uses the {env['collector']} "
                f"collector). Fix: add --collector ray, or drop {flags}."
            )
        return
    per = options.get(f"env{_SEP}envs_per_worker")
    if per is not None and f"env{_SEP}num_envs" not in options and isinstance(per, int):
        env["num_envs"] = env["workers"] * per


def _shown(name: str, value: Any) -> str:
    """``--option value`` as typed on the command line (``--flag`` / ``--no-flag``)."""
    flag = _flag(name.rpartition(_SEP)[2])
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    return f"{flag} {value}"


def _conflict_message(run_dir: str, conflicts: list[tuple[str, Any, Any]]) -> str:
    changed = "; ".join(
        f"the run has {_shown(n, old)}, received {_shown(n, new)}" for n, old, new in conflicts
    )
    flags = " ".join(dict.fromkeys(_flag(n.rpartition(_SEP)[2]) for n, _, _ in conflicts))
    allowed = ", ".join(sorted({_flag(n.rpartition(_SEP)[2]) for n in RESUMABLE} - {"--run-dir"}))
    return (
        f"--resume {run_dir} cannot change what its checkpoint was trained with: {changed}. "
        f"Fix: drop {flags} (a resumed run may only change {allowed}), or start a new run "
        f"with these options and another --run-dir."
    )


def _default_run_dir(cfg: TrainConfig) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    algo = "" if cfg.algo == "ppo" else f"{cfg.algo}-"  # PPO runs keep their historical names
    env = cfg.env.env.replace(":", "_").replace("/", "_")  # module:EnvId, namespaced ids
    return str(Path("runs") / f"{env}-{algo}{cfg.model.memory}-s{cfg.run.seed}-{stamp}")


def _check_device(device: str) -> None:
    """A usage error when ``device`` does not exist on this machine (before anything runs)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        return
    backend = getattr(torch, dev.type, None)  # torch.cuda, torch.mps, torch.xpu
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        built = f"; this torch {torch.__version__} is built without CUDA" if (
            dev.type == "cuda" and torch.version.cuda is None) else ""  # fmt: skip
        raise UsageError(
            f"--device {device}: {dev.type.upper()} is not available on this machine{built}. "
            f"Fix: --device cpu."
        )
    count = getattr(backend, "device_count", lambda: 1)()
    if dev.index is not None and dev.index >= count:
        raise UsageError(
            f"--device {device}: this machine has {count} {dev.type} device(s), numbered from "
            f"0. Fix: --device {dev.type}:0."
        )


def _check_backend(cfg: TrainConfig) -> None:
    """A usage error when ``--recurrent-backend`` cannot run on ``--device`` here (e.g.
    ``triton`` without CUDA or without the package), before anything runs."""
    from recurrl.functional.recurrent import check_recurrent_options
    from recurrl.modules.registry import MEMORY_REGISTRY

    model = cfg.model
    if model.memory not in MEMORY_REGISTRY:
        return  # the feed-forward trunk has no recurrent backend
    try:
        check_recurrent_options(
            model.recurrent_backend, "none", python_based=False, device=cfg.run.device,
            mode=MEMORY_REGISTRY[model.memory].cell,
        )  # fmt: skip
    except (ImportError, RuntimeError, ValueError) as err:
        raise UsageError(
            f"--recurrent-backend {model.recurrent_backend} with --device {cfg.run.device}: "
            f"{err} Fix: --recurrent-backend auto."
        ) from err


def _prog() -> str:
    """How the user called the command (for the commands we print)."""
    return "python -m recurrl" if Path(sys.argv[0]).name == "__main__.py" else "recurrl"


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the command; exit status ``128 + signum`` (130, 143)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Signals:
    """SIGINT / SIGTERM handling of one command (installed by :func:`main`).

    Outside training a signal raises :class:`Interrupted` (no traceback, cleanup runs). While
    a trainer runs (:attr:`training`), the first signal only sets :attr:`stop`: the trainer
    finishes its batch, saves a checkpoint at that batch boundary (so the resumed run replays
    the uninterrupted one) and returns. A second signal stops at once, without saving.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.signum: int | None = None
        self.training = False

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.training or self.stop.is_set():
            raise Interrupted(signum)
        self.signum = signum
        self.stop.set()
        print(
            f"\n{signal.Signals(signum).name}: stopping after the current batch to save a "
            f"checkpoint (send it again to stop at once, without saving).",
            file=sys.stderr, flush=True,
        )  # fmt: skip

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Signals]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signal handlers can only be set in the main thread
            return
        previous = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


@contextlib.contextmanager
def _new_dir(path: Path) -> Iterator[Callable[[], None]]:
    """Create ``path`` (and missing parents) for a new run; remove what was created if the
    block fails before it calls the yielded ``started()`` (a failed start leaves nothing)."""
    if path.exists() and not path.is_dir():
        raise UsageError(
            f"--run-dir {path} is a file; expected a directory (new, or an existing one). "
            f"Fix: another --run-dir."
        )
    created = next((p for p in reversed([path, *path.parents]) if not p.exists()), None)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(
            f"--run-dir {path} cannot be created ({err.strerror}: {err.filename}). Fix: "
            f"another --run-dir, in a directory you can write to."
        ) from err
    done = False

    def started() -> None:
        nonlocal done
        done = True

    try:
        yield started
    except BaseException:
        if created is not None and not done:
            shutil.rmtree(created, ignore_errors=True)
        raise


def _say_rounded_frames(args: argparse.Namespace, cfg: TrainConfig) -> None:
    """One line when a given ``--frames`` was rounded up to whole batches (the batch then
    follows ``--num-envs``: ``frames_per_batch=None``)."""
    given = getattr(args, f"{_ALGO}{_SEP}frames", None)
    section = getattr(cfg, cfg.algo)
    if given is not None and given != section.frames:
        print(
            f"recurrl train: --frames {given} rounded up to {section.frames}, a whole number of "
            f"{section.frames_per_batch}-frame batches ({cfg.env.num_envs} envs x "
            f"{section.frames_per_batch // cfg.env.num_envs} steps)",
            file=sys.stderr,
            flush=True,
        )


def _train(args: argparse.Namespace, signals: _Signals) -> int:
    if args.trust_checkpoint and not args.resume:
        raise UsageError(
            "--trust-checkpoint applies to a resumed run's checkpoint, but no --resume was "
            "given. Fix: add --resume RUN_DIR, or drop --trust-checkpoint."
        )
    cfg = config_from_args(args)
    _check_device(cfg.run.device)
    _check_backend(cfg)
    if cfg.run.resume_on_failure and not in_child():
        return _supervised(args, cfg)
    if not args.resume:
        _say_recipe(args, cfg)
    _say_rounded_frames(args, cfg)
    if args.resume:
        run_dir = Path(args.resume)
        with lock_run_dir(run_dir):  # first: a live run may not have its checkpoint yet
            return _resume(cfg, run_dir, signals, trust=args.trust_checkpoint)
    if cfg.run.run_dir is None:
        cfg.run.run_dir = _default_run_dir(cfg)
    run_dir = Path(cfg.run.run_dir)
    with _new_dir(run_dir) as started, lock_run_dir(run_dir):
        if (run_dir / CHECKPOINT).exists():
            raise UsageError(
                f"{run_dir} already holds a run. Fix: --resume {run_dir} to continue it, or "
                f"another --run-dir."
            )
        print(f"run directory: {run_dir}", flush=True)
        trainer = _trainer(cfg)(cfg)
        _write_config(cfg, run_dir)
        started()
        return _run(trainer, cfg, run_dir, signals)


def _supervised(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """``--resume-on-failure N``: the same command in a child process, restarted from the
    run's last checkpoint when it dies (:mod:`~recurrl.trainers.supervisor`)."""
    argv = list(args.command_argv)
    if args.resume:
        run_dir = Path(args.resume)
    else:
        if cfg.run.run_dir is None:  # chosen once: every restart continues the same run
            cfg.run.run_dir = _default_run_dir(cfg)
            argv += ["--run-dir", cfg.run.run_dir]
        run_dir = Path(cfg.run.run_dir)
    return supervise(argv, run_dir, retries=cfg.run.resume_on_failure, prog=_prog())


def _resume(cfg: TrainConfig, run_dir: Path, signals: _Signals, *, trust: bool) -> int:
    from recurrl.trainers import checkpoint as ckpt

    require_checkpoint(run_dir)
    state = ckpt.load(run_dir)
    done, frames = int(state["frames"]), _section(cfg).frames
    if done >= frames:
        if done > frames:
            raise UsageError(
                f"--frames {frames} is fewer than the {done} frames the run in {run_dir} has "
                f"already trained. Fix: --frames {done + _section(cfg).frames_per_batch} or more."
            )
        print(
            f"nothing to do: the run in {run_dir} has already trained its {frames} frames. To "
            f"train it further: {_prog()} train --resume {shlex.quote(str(run_dir))} --frames "
            f"{2 * frames} (any larger multiple of --frames-per-batch)."
        )
        print(run_dir)
        return 0
    print(f"resuming {run_dir} from frame {done} of {frames}", flush=True)
    trainer = _trainer(cfg)(cfg, resume=True, state=state, trust_checkpoint=trust)
    _write_config(cfg, run_dir)  # only now: a refused or failed resume leaves it as it was
    return _run(trainer, cfg, run_dir, signals)


def _section(cfg: TrainConfig) -> Any:
    return getattr(cfg, cfg.algo)


def _trainer(cfg: TrainConfig) -> Any:
    from recurrl.trainers.dqn import DQNTrainer
    from recurrl.trainers.ppo import PPOTrainer

    return DQNTrainer if cfg.algo == "dqn" else PPOTrainer


def _write_config(cfg: TrainConfig, run_dir: Path) -> None:
    path = run_dir / CONFIG
    tmp = path.with_suffix(".tmp")  # atomic: a kill never leaves a run without its config
    tmp.write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    os.replace(tmp, path)


def _run(trainer: Any, cfg: TrainConfig, run_dir: Path, signals: _Signals) -> int:
    """Train (a signal stops at the next batch boundary, with a checkpoint), then evaluate."""
    resume = f"{_prog()} train --resume {shlex.quote(str(run_dir))}"
    signals.training = True
    try:
        trainer.train(stop=kill_hook(signals.stop, trainer))
    except Interrupted as err:
        then = (
            f"{resume} continues from the last checkpoint."
            if (run_dir / CHECKPOINT).exists()
            else "no checkpoint was saved yet: start the run again."
        )
        name = signal.Signals(err.signum).name
        print(f"stopped by {name} without saving the current batch; {then}", file=sys.stderr)
        print(run_dir)
        return 128 + err.signum
    except UsageError:
        raise
    except Exception as err:  # one paragraph; the traceback goes to run_dir/error.log
        with contextlib.suppress(Exception):  # e.g. a Ray collector already shut down
            trainer.collector.shutdown()
        print(failure_report(err, run_dir, saved_frames=_saved_frames(run_dir), prog=_prog()),
              file=sys.stderr, flush=True)  # fmt: skip
        return 1
    finally:
        signals.training = False
    frames, target = trainer.collector.frames, _section(cfg).frames
    if signals.stop.is_set():
        assert signals.signum is not None
        then = f"Resume with: {resume}" if frames < target else "The run is complete."
        print(
            f"stopped by {signal.Signals(signals.signum).name} at frame {frames} of {target}; "
            f"checkpoint saved. {then}",
            file=sys.stderr,
        )
        print(run_dir)
        return 128 + signals.signum
    if cfg.run.eval_episodes:
        returns = evaluate(run_dir, episodes=cfg.run.eval_episodes)
        print(f"greedy evaluation: {_summary(returns)}")
    print(run_dir)
    return 0


def _saved_frames(run_dir: Path) -> int | None:
    """The frames of ``run_dir``'s checkpoint (None: none, or one that cannot be read)."""
    from recurrl.trainers import checkpoint as ckpt

    if not (run_dir / CHECKPOINT).exists():
        return None
    try:
        return int(ckpt.load(run_dir)["frames"])
    except Exception:  # the report says what it can
        return None


def _summary(returns: list[float]) -> str:
    mean, std = statistics.fmean(returns), statistics.pstdev(returns)
    return f"mean_return: {mean:.2f} ± {std:.2f} over {len(returns)} episodes"


def _eval(args: argparse.Namespace) -> int:
    def progress(done: int, total: int) -> None:
        print(f"episodes done: {done}/{total}", file=sys.stderr, flush=True)

    returns = evaluate(
        args.run_dir, episodes=args.episodes, seed=args.seed, deterministic=not args.sample,
        progress=progress, engine=args.engine,
    )  # fmt: skip
    print(_summary(returns))
    return 0


@contextlib.contextmanager
def _plain_warnings(prog: str) -> Iterator[None]:
    """Show the library's warnings (e.g. a resume that starts new episodes) as one line
    ``<prog>: warning: <message>`` instead of python's file, line and source excerpt."""

    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        print(f"{prog}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    # the library's log warnings too (e.g. a replaced Ray worker): one line each on stderr
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"{prog}: warning: %(message)s"))
    library = logging.getLogger("recurrl")
    library.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            yield
    finally:
        library.removeHandler(handler)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown option is reported with its subcommand's usage (argparse
    itself reports it with the top-level usage, which does not list the option)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``recurrl`` command; returns the exit status.

    Plugins (:mod:`recurrl.trainers.plugins`: ``$RECURRL_PLUGINS``, installed entry points)
    are imported first, so the memories and backends they register are valid options.

    0: done. 2: a usage error (argparse's, or a :class:`~recurrl.trainers.errors.UsageError`:
    one line on stderr). 130 / 143: stopped by SIGINT / SIGTERM. 1: the training failed
    (one paragraph on stderr: what died, where, what was saved, the resume command; the
    traceback in ``run_dir/error.log``). Any other exception (e.g. while the run starts) is
    an internal error and propagates (traceback, status 1).
    """
    try:  # first: a plugin's memories and backends are choices of the parser
        load_plugins()
    except UsageError as err:
        print(f"recurrl: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    train_argv: list[str] = []
    if argv[:1] in (["sweep"], ["bench"]):  # `recurrl sweep [options] -- <train options>`
        argv, train_argv = split_train_argv(argv)
    args = _parse(parser, argv)
    args.command_argv = argv  # --resume-on-failure runs the same command in a child
    signals = _Signals()
    try:
        with signals.installed(), _plain_warnings(f"recurrl {args.command}"):
            if args.command == "sweep":
                return run_sweep(args, train_argv)
            if args.command == "bench":
                return run_bench(args, train_argv)
            if args.command == "build-ext":
                return _build_ext(args)
            if args.command == "export":
                return run_export(args)
            return _train(args, signals) if args.command == "train" else _eval(args)
    except UsageError as err:
        print(f"recurrl {args.command}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print(f"recurrl {args.command}: interrupted", file=sys.stderr)
        return 128 + getattr(err, "signum", signal.SIGINT)


if __name__ == "__main__":
    sys.exit(main())
