"""The one training loop that every recipe plugs into: collect, learn, log, checkpoint, stop.

:class:`Trainer` holds what the recipes share: the start of a run (run directory, device,
torch threads, seeding, the env, resuming from a checkpoint, the metrics logger) and the
loop, :meth:`Trainer.train`. :class:`~recurrl.trainers.PPOTrainer` and
:class:`~recurrl.trainers.DQNTrainer` are subclasses; a new algorithm is one file with one
more (see the example in :class:`Trainer`).
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from time import monotonic, perf_counter
from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase

from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.collection import RECENT_EPISODES, episode_returns, next_batch
from recurrl.trainers.config import TrainConfig
from recurrl.trainers.logger import MetricsLogger, plot_learning_curve
from recurrl.trainers.models import make_env

__all__ = ["ERROR_LOG", "Trainer"]

#: the run directory's log of failures (worker replacements, a run that ended on an error)
ERROR_LOG = "error.log"


class Trainer:
    """The start of a run and the training loop of every recipe.

    A recipe is a subclass that names its config section (:attr:`algo`) and fills in the
    hooks:

    * ``build()`` (required): the recipe's own objects, built between the env and the resume;
      it must set ``model``, ``optimizer`` and ``collector`` (what a checkpoint saves, besides
      the recipe's optional ``extra_state()`` / ``load_extra_state(state)``).
    * ``before_batch() -> dict`` (optional): set what the next batch is collected and learned
      with (schedules, exploration: functions of the frames done, so a resumed run follows
      them); returns the values to log.
    * ``learn(batch, logged) -> dict`` (required): learn from the collected ``batch``, count it
      in ``batches`` and return its metrics row, ``logged`` (what ``before_batch`` returned)
      included where the recipe wants its columns. :meth:`Trainer.track_episodes` and
      :meth:`Trainer.episode_row` give the episode columns every recipe logs.
    * ``progress(row) -> str`` (optional): the recipe's end of the progress line.
    * ``start()`` / ``close()`` (optional): once before the first batch / after the last
      (``close`` of a subclass calls ``super().close()``).

    One batch of the loop: ``before_batch``, :func:`~recurrl.trainers.collection.next_batch`,
    ``learn``; the row gets the timing columns (``fps``: frames per second of this batch, from
    the end of the previous one, so a one-time compile or warm-up at the start does not drag it
    down for the rest of the run; ``fps_mean``: since :meth:`Trainer.train` started;
    ``time_s``: seconds since then), goes to ``metrics.csv`` (and TensorBoard) and, unless
    ``cfg.run.quiet``, to a progress line. A checkpoint is written when the frames cross a
    multiple of ``cfg.run.checkpoint_every``, when ``cfg.run.checkpoint_every_s`` seconds (if
    set) have passed since the last one (or since the start), at the last batch, and when
    ``stop`` is set (then the loop returns). With a collector that replaces failed workers (a
    :class:`~recurrl.collectors.RayCollector`), the row also holds ``worker_restarts``: the
    replacements so far in the run, each of whose failures (remote traceback included) is
    appended to ``run_dir/error.log``. After the loop: ``close()``, and the learning curve is
    plotted if the run trained all its frames.

    The constructor builds, in this order: ``run_dir``, ``device``, torch's thread
    count, the seeds (torch, numpy, python), ``env``
    (:func:`~recurrl.trainers.models.make_env`), then the recipe's objects (``build()``),
    restores them from the checkpoint with ``resume``, and opens the metrics logger
    (``metrics.csv`` cut back to the checkpoint's frames).

    Args:
        cfg: the resolved config (``cfg.run.run_dir`` set).
        resume: continue from ``run_dir/checkpoint.pt``.
        trust_checkpoint: with ``resume``, also restore the simulators stored in the
            checkpoint (a pickle: only for a checkpoint you wrote or trust); see
            :func:`recurrl.trainers.checkpoint.restore`.
        state: with ``resume``, the checkpoint already read by :func:`checkpoint.load
            <recurrl.trainers.checkpoint.load>` (else it is read from ``run_dir``).

    Examples:
        A third recipe is one file: A2C is PPO's loss without clipping (the ratio is 1 on the
        batch just collected, so its gradient is the policy gradient), one step per batch.

        >>> import tempfile
        >>> import torch
        >>> from recurrl.objectives import GAE, ClipPPOLoss
        >>> from recurrl.trainers import EnvConfig, PPOConfig, RunConfig, TrainConfig
        >>> from recurrl.trainers.collection import make_collector
        >>> from recurrl.trainers.logger import read_metrics
        >>> from recurrl.trainers.loop import Trainer
        >>> from recurrl.trainers.models import actor_critic
        >>> class A2CTrainer(Trainer):
        ...     algo = "ppo"  # frames, frames_per_batch, lr, gamma, ...: from cfg.ppo
        ...
        ...     def build(self):
        ...         p = self.cfg.ppo
        ...         self.model = actor_critic(self.cfg, self.env)
        ...         self.gae = GAE(p.gamma, p.gae_lambda, self.model.critic)
        ...         self.loss = ClipPPOLoss(self.model.actor, self.model.critic, clip_epsilon=1e9)
        ...         self.optimizer = torch.optim.Adam(self.model.parameters(), lr=p.lr)
        ...         self.collector = make_collector(
        ...             self.cfg, self.env, self.model.policy(), device=self.device,
        ...             frames_per_batch=p.frames_per_batch, total_frames=p.frames)
        ...
        ...     def learn(self, batch, logged):
        ...         returns = self.track_episodes(batch)
        ...         self.gae(batch)
        ...         out = self.loss(batch)
        ...         loss = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        ...         self.optimizer.zero_grad()
        ...         loss.backward()
        ...         self.optimizer.step()
        ...         self.batches += 1
        ...         return {**self.episode_row(returns), **logged, "loss": loss.item()}
        ...
        ...     def progress(self, row):
        ...         return f"loss {row['loss']:.3f}"
        >>> with tempfile.TemporaryDirectory() as run_dir:
        ...     cfg = TrainConfig(
        ...         env=EnvConfig(num_envs=4), ppo=PPOConfig(frames=256, frames_per_batch=128),
        ...         run=RunConfig(run_dir=run_dir, quiet=True, plot=False, tensorboard=False))
        ...     _ = A2CTrainer(cfg).train()
        ...     [(r["frames"], r["batch"]) for r in read_metrics(run_dir)]
        [('128', '1'), ('256', '2')]
    """

    #: the config section of the recipe (``"ppo"``, ``"dqn"``): its ``frames`` and
    #: ``frames_per_batch`` drive the loop; upper-cased, it titles the learning curve
    algo: ClassVar[str]

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        resume: bool = False,
        trust_checkpoint: bool = False,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run.run_dir or ".")
        self.device = torch.device(cfg.run.device)
        if cfg.run.num_threads:
            torch.set_num_threads(cfg.run.num_threads)
        ckpt.seed_everything(cfg.run.seed)
        self.env = make_env(cfg.env, seed=cfg.run.seed, device=self.device)
        #: returns of the last :data:`~recurrl.trainers.collection.RECENT_EPISODES` episodes
        self.recent: deque[float] = deque(maxlen=RECENT_EPISODES)
        #: batches learned from (saved in checkpoints)
        self.batches = 0
        self.build()
        if resume:
            state = ckpt.load(self.run_dir) if state is None else state
            ckpt.restore(state, self, trust=trust_checkpoint)
        self.logger = MetricsLogger(
            self.run_dir, tensorboard=cfg.run.tensorboard, truncate_after=self.collector.frames
        )

    @property
    def section(self) -> Any:
        """The recipe's config section, ``cfg.<algo>`` (e.g. a :class:`PPOConfig
        <recurrl.trainers.PPOConfig>`)."""
        return getattr(self.cfg, self.algo)

    # ------------------------------------------------------------------ hooks
    def build(self) -> None:
        """Build the recipe's objects; must set ``model``, ``optimizer`` and ``collector``."""
        raise NotImplementedError(f"{type(self).__name__} must define build().")

    def start(self) -> None:
        """Called once when :meth:`train` starts (e.g. to print what the run acts with)."""

    def before_batch(self) -> dict[str, Any]:
        """Set what the next batch is collected and learned with; the values to log."""
        return {}

    def learn(self, batch: TensorDictBase, logged: dict[str, Any]) -> dict[str, Any]:
        """Learn from ``batch``, count it in :attr:`batches`; the metrics row (no timing)."""
        raise NotImplementedError(f"{type(self).__name__} must define learn(batch, logged).")

    def progress(self, row: dict[str, Any]) -> str:
        """The recipe's end of the progress line of ``row`` (e.g. ``"loss 0.123"``)."""
        return ""

    def checkpoint(self) -> None:
        """Save ``run_dir/checkpoint.pt`` (see :mod:`recurrl.trainers.checkpoint`)."""
        ckpt.save(self.run_dir, self)

    def close(self) -> None:
        """Close the logger and shut the collector down (after the last batch)."""
        self.logger.close()
        self.collector.shutdown()

    # ------------------------------------------------------------------ helpers for learn
    def track_episodes(self, batch: TensorDictBase) -> list[float]:
        """The returns of the episodes that ended in ``batch``, added to :attr:`recent`."""
        returns = episode_returns(batch)
        self.recent.extend(returns)
        return returns

    def episode_row(self, returns: list[float]) -> dict[str, Any]:
        """The columns every recipe logs first: frames, batch, episodes that ended in the
        batch, their mean return and the mean return of :attr:`recent`."""
        return {
            "frames": self.collector.frames,
            "batch": self.batches,
            "episodes": len(returns),
            "episode_return": sum(returns) / len(returns) if returns else math.nan,
            "recent_return": sum(self.recent) / len(self.recent) if self.recent else math.nan,
        }

    # ------------------------------------------------------------------ the loop
    def train(self, *, stop_after: int | None = None, stop: Any = None) -> Path:
        """Run until ``cfg.<algo>.frames`` (or ``stop_after`` frames, a simulated
        interruption).

        Args:
            stop_after: stop (with a checkpoint) at the first batch that reaches this many
                frames; the run is then not complete (no learning curve).
            stop: an object with ``is_set()`` (a :class:`threading.Event`), asked once after
                every batch: once set, the run saves a checkpoint and returns (a clean stop on
                Ctrl-C; the checkpoint lies on a batch boundary, so resuming is exact).

        Returns the run directory.
        """
        total, per_batch = self.section.frames, self.section.frames_per_batch
        every, every_s = self.cfg.run.checkpoint_every, self.cfg.run.checkpoint_every_s
        saved_at = monotonic()
        limit = total if stop_after is None else min(stop_after, total)
        start = last = perf_counter()
        start_frames = last_frames = self.collector.frames
        self.start()
        while self.collector.frames < limit:
            logged = self.before_batch()
            row = self.learn(next_batch(self), logged)
            frames, now = self.collector.frames, perf_counter()
            row["fps"] = (frames - last_frames) / max(now - last, 1e-9)
            row["fps_mean"] = (frames - start_frames) / max(now - start, 1e-9)
            row["time_s"] = now - start
            last, last_frames = now, frames
            self._track_worker_restarts(row)
            self.logger.log(row)
            if not self.cfg.run.quiet:
                print(self.progress_line(row), flush=True)
            stopping = stop is not None and stop.is_set()
            due = frames // every > (frames - per_batch) // every
            due = due or (every_s is not None and monotonic() - saved_at >= every_s)
            if due or frames >= limit or stopping:
                self.checkpoint()
                saved_at = monotonic()
            if stopping:
                break
        self.close()
        if self.cfg.run.plot and self.collector.frames >= total:
            title = f"{self.algo.upper()} {self.cfg.model.memory} on {self.cfg.env.env}"
            plot_learning_curve(self.run_dir, title=title)
        return self.run_dir

    def _track_worker_restarts(self, row: dict[str, Any]) -> None:
        """``row["worker_restarts"]`` for a collector that replaces failed workers; their new
        failures (and those of a replay buffer that rebuilt its actor, ``buffer.faults``)
        appended to ``run_dir/error.log``."""
        restarts = getattr(self.collector, "restarts", None)
        if restarts is not None:
            row["worker_restarts"] = restarts
        self._log_faults(self.collector, "a Ray worker was replaced")
        self._log_faults(getattr(self, "buffer", None), "the replay buffer's actor was rebuilt")

    def _log_faults(self, source: Any, what: str) -> None:
        """Append the entries of ``source.faults`` not written yet to ``run_dir/error.log``."""
        faults = getattr(source, "faults", None)
        if not isinstance(faults, list):
            return
        written = self.__dict__.setdefault("_faults_written", {})
        if len(faults) > written.get(what, 0):
            with (self.run_dir / ERROR_LOG).open("a") as f:
                for fault in faults[written.get(what, 0) :]:
                    f.write(f"--- frame {self.collector.frames}: {what}\n")
                    f.write(fault.rstrip() + "\n")
            written[what] = len(faults)

    def progress_line(self, row: dict[str, Any]) -> str:
        """The progress line of ``row``: ``frames 2000/50000 | 1900 fps | return 27.0 (last 20
        episodes)`` (the frames per second of that batch), then :meth:`progress`'s part."""
        line = (
            f"frames {row['frames']}/{self.section.frames} | {row['fps']:.0f} fps | return "
            f"{row['recent_return']:.1f} (last {len(self.recent)} episodes)"
        )
        extra = self.progress(row)
        return f"{line} | {extra}" if extra else line
