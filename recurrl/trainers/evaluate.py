"""Evaluate a trained run: the returns of ``K`` fresh episodes of its checkpointed policy."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import torch

from recurrl.collectors import Collector
from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.config import TrainConfig
from recurrl.trainers.encoders import observation_inputs
from recurrl.trainers.errors import CheckpointError, UsageError
from recurrl.trainers.models import QNetwork, actor_critic, make_env

__all__ = ["CONFIG", "evaluate", "load_config", "require_checkpoint"]

CONFIG = "config.json"
STEPS_PER_BATCH = 100


def load_config(run_dir: Path | str) -> TrainConfig:
    """The resolved config saved in ``run_dir/config.json``.

    Raises:
        CheckpointError: the file is missing, is not JSON (empty, truncated, garbage), or
            holds an unknown entry, a value of the wrong type or an invalid setting; the
            message names the file.
    """
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        what = "does not exist" if not Path(run_dir).exists() else f"holds no {CONFIG}"
        raise CheckpointError(
            f"expected a run directory, but {run_dir} {what}. Fix: pass the run directory "
            f"that `recurrl train` printed on its last line."
        )
    fix = "Fix: correct the file, or copy it from a backup of the run."
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        what = "empty" if not path.stat().st_size else f"not valid JSON ({err})"
        raise CheckpointError(f"{path}: expected the JSON config of a run, the file is {what}. "
                              f"{fix}") from err  # fmt: skip
    try:
        return TrainConfig.from_dict(data, saved=True)
    except (ValueError, TypeError) as err:
        message = str(err) if "Fix:" in str(err) else f"{err} {fix}"
        raise CheckpointError(f"{path}: {message}") from err


def require_checkpoint(run_dir: Path | str) -> Path:
    """``run_dir/checkpoint.pt``; a :class:`CheckpointError` saying why when it is missing."""
    path = Path(run_dir) / ckpt.CHECKPOINT
    if not path.is_file():
        raise CheckpointError(
            f"expected {path}, written by `recurrl train` at its first checkpoint, but it does "
            f"not exist (the run stopped before it). Fix: start the run again, or pass the "
            f"directory of a run that saved a checkpoint."
        )
    return path


def evaluate(
    run_dir: Path | str,
    *,
    episodes: int = 10,
    seed: int | None = None,
    deterministic: bool = True,
    max_steps: int = 100_000,
    progress: Callable[[int, int], None] | None = None,
    engine: str | None = None,
) -> list[float]:
    """Run ``episodes`` episodes (one per env, in parallel) and return their returns.

    Args:
        run_dir: a run directory (``config.json`` and ``checkpoint.pt``).
        episodes: number of episodes.
        seed: env and torch seed; default: the run's seed + 1 (episodes unseen in training).
        deterministic: act with the most likely action (else sample; DQN: epsilon-greedy
            at the run's final epsilon).
        max_steps: give up when an episode is longer than this.
        progress: called as ``progress(done, episodes)`` whenever more episodes have ended.
        engine: what steps the evaluation envs (an ``EnvConfig.engine`` value); default: the
            run's own. The same task on another engine has the same dynamics but draws its
            random starts differently: ``"gymnasium"`` gives the episodes of gymnasium's own
            env for a seed, as the torch-free runner of ``examples/deploy`` plays them.
    """
    if episodes < 1:
        raise UsageError(
            f"evaluate: episodes must be >= 1, received {episodes}. Fix: --episodes 10."
        )
    cfg = load_config(run_dir)
    require_checkpoint(run_dir)
    state = ckpt.load(run_dir)
    seed = cfg.run.seed + 1 if seed is None else seed
    torch.manual_seed(seed)
    env_cfg = cfg.env
    if engine is not None and engine != env_cfg.engine:
        try:
            env_cfg = dataclasses.replace(env_cfg, engine=engine)
        except ValueError as err:  # the config's own check of the engine
            raise UsageError(f"evaluate(engine={engine!r}): {err}") from err
    env = make_env(env_cfg, num_envs=episodes, seed=seed)
    if cfg.algo == "dqn":  # greedy, or epsilon-greedy at the final training epsilon
        inputs = observation_inputs(env)  # the vector size and the image shape, if any
        model = QNetwork(cfg.model, inputs, env.action_spec.n, obs_scale=cfg.dqn.obs_scale)
        model.load_state_dict(state["model"])
        policy = model.policy(epsilon=0.0 if deterministic else cfg.dqn.eps_end)
    else:
        model = actor_critic(cfg, env)
        model.load_state_dict(state["model"])
        policy = model.policy(deterministic)
    model.eval()
    returns: list[float | None] = [None] * episodes
    collector = Collector(env, policy, frames_per_batch=episodes * STEPS_PER_BATCH)
    try:
        while any(r is None for r in returns):
            if collector.frames >= episodes * max_steps:
                raise RuntimeError(
                    f"evaluate: an episode ran past max_steps={max_steps} without ending."
                )
            batch = collector.rollout()
            done = batch["next", "done"].squeeze(-1)
            ret = batch["next", "episode_reward"].squeeze(-1)
            before = sum(r is not None for r in returns)
            for i in range(episodes):
                if returns[i] is None and bool(done[i].any()):
                    returns[i] = float(ret[i][done[i]][0])
            finished = sum(r is not None for r in returns)
            if progress is not None and finished > before:
                progress(finished, episodes)
    finally:
        collector.shutdown()
    return [float(r) for r in returns if r is not None]
