"""The PPO recipe: collect ``[N, T]`` batches, GAE, epochs of minibatched clipped-PPO updates.

One batch of the loop (:func:`train`):

1. the :class:`~recurrl.collectors.Collector` (or, with ``--collector ray``, a
   :class:`~recurrl.collectors.RayCollector` of Ray workers) runs the policy (sequential
   mode, one step at a time) in ``N`` envs for ``T`` steps; actions are sampled and their
   log-probabilities stored; hidden states ride in the TensorDict;
2. :class:`~recurrl.objectives.GAE` runs the critic over the whole ``[N, T]`` batch in
   recurrent mode and writes ``"advantage"`` / ``"value_target"``;
3. ``epochs`` passes over the batch cut into ``num_minibatches`` random sets of whole env
   rows (or of ``slice_len``-step slices of them; each row restarts from the hidden state
   stored at its first step): :class:`~recurrl.objectives.ClipPPOLoss`, Adam, gradient
   clipping.

Same seed, same numbers; a run stopped after a checkpoint and resumed gives the numbers of
the uninterrupted run when its simulators were saved (``--save-simulator``) and restored
(``--trust-checkpoint``); see :mod:`recurrl.trainers.checkpoint`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from recurrl.objectives import GAE, ClipPPOLoss
from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.collection import RECENT_EPISODES, episode_returns, make_collector, next_batch
from recurrl.trainers.config import TrainConfig
from recurrl.trainers.logger import MetricsLogger, plot_learning_curve
from recurrl.trainers.models import ActorCritic, actor_critic, make_env

__all__ = ["PPOTrainer", "train"]


class _SquashedGaussianPPOLoss(ClipPPOLoss):
    """:class:`ClipPPOLoss` for the continuous :class:`ActorCritic`: the distribution is its
    tanh-squashed Gaussian rescaled to the action bounds (log-probabilities of the actions the
    env received, tanh and rescaling Jacobians included; a one-sample entropy estimate)."""

    def __init__(self, model: ActorCritic, **kwargs: Any) -> None:
        super().__init__(model.actor, model.critic, **kwargs)
        self._distribution = model.distribution  # a bound method, not a second submodule

    def get_distribution(self, params: TensorDictBase) -> torch.distributions.Distribution:
        return self._distribution(params.get("loc"), params.get("scale"))


class _FactorizedCategoricalPPOLoss(ClipPPOLoss):
    """:class:`ClipPPOLoss` for the ``MultiDiscrete`` :class:`ActorCritic`: the distribution
    is its product of independent categoricals over the actor's ``"logits"`` (log-probability
    and entropy summed over the action's dimensions)."""

    def __init__(self, model: ActorCritic, **kwargs: Any) -> None:
        super().__init__(model.actor, model.critic, **kwargs)
        self._distribution = model.factorized_distribution  # a bound method, not a submodule

    def get_distribution(self, params: TensorDictBase) -> torch.distributions.Distribution:
        return self._distribution(params.get("logits"))


def _loss_terms(loss: ClipPPOLoss, minibatch: TensorDictBase) -> tuple[torch.Tensor, dict]:
    """The scalar to minimize and the detached diagnostics of one minibatch."""
    out = loss(minibatch)
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    stats = {k: out[k].detach() for k in ("loss_objective", "loss_critic", "entropy",
                                          "kl_approx", "clip_fraction")}  # fmt: skip
    return total, stats


def minibatches(
    batch: TensorDictBase, num_minibatches: int, slice_len: int
) -> Iterator[TensorDictBase]:
    """Random minibatches of whole env rows (``slice_len=0``) or of ``slice_len``-step slices.

    A slice that starts mid-episode has ``is_init`` False at its first step; recurrent mode
    restarts it from the hidden state stored there (the state the collector carried).
    Uses torch's global RNG.
    """
    n, t = batch.batch_size
    rows = batch.reshape(n * (t // slice_len), slice_len) if slice_len else batch
    for idx in torch.randperm(rows.batch_size[0]).chunk(num_minibatches):
        yield rows[idx]


class PPOTrainer:
    """Builds everything from a :class:`TrainConfig` and runs the loop; see the module doc.

    Args:
        cfg: the resolved config (``cfg.run.run_dir`` set).
        resume: continue from ``run_dir/checkpoint.pt``.
        trust_checkpoint: with ``resume``, also restore the simulators stored in the
            checkpoint (a pickle: only for a checkpoint you wrote or trust); see
            :func:`recurrl.trainers.checkpoint.restore`.
        state: with ``resume``, the checkpoint already read by :func:`checkpoint.load
            <recurrl.trainers.checkpoint.load>` (else it is read from ``run_dir``).
    """

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
        self.env = make_env(cfg.env, seed=cfg.run.seed)
        self.model = actor_critic(cfg, self.env).to(self.device)
        p = cfg.ppo
        self.gae = GAE(p.gamma, p.gae_lambda, self.model.critic)
        terms = dict(
            clip_epsilon=p.clip_epsilon, entropy_coef=p.entropy_coef, critic_coef=p.critic_coef,
            normalize_advantage=p.normalize_advantage, clip_value=p.clip_value,
        )  # fmt: skip
        if self.model.continuous:
            self.loss = _SquashedGaussianPPOLoss(self.model, **terms)
        elif self.model.action_nvec is not None:
            self.loss = _FactorizedCategoricalPPOLoss(self.model, **terms)
        else:
            self.loss = ClipPPOLoss(self.model.actor, self.model.critic, **terms)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=p.lr, eps=1e-5)
        self.collector = make_collector(
            cfg, self.env, self.model.policy(), frames_per_batch=p.frames_per_batch,
            total_frames=p.frames, device=self.device,
        )  # fmt: skip
        self.recent: deque[float] = deque(maxlen=RECENT_EPISODES)
        self.batches = 0
        if resume:
            state = ckpt.load(self.run_dir) if state is None else state
            ckpt.restore(state, self, trust=trust_checkpoint)
        self.logger = MetricsLogger(
            self.run_dir, tensorboard=cfg.run.tensorboard, truncate_after=self.collector.frames
        )

    # ------------------------------------------------------------------ one batch
    def _set_schedules(self) -> None:
        """Learning rate, entropy weight and clip range of the next batch (functions of the
        frames done, so a resumed run follows the same schedule)."""
        p = self.cfg.ppo
        progress = self.collector.frames / p.frames
        if p.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = p.lr * (1.0 - progress)
        if p.entropy_coef_end is not None:
            coef = p.entropy_coef + (p.entropy_coef_end - p.entropy_coef) * progress
            self.loss.entropy_coef = coef
        if p.clip_epsilon_end is not None:
            eps = p.clip_epsilon + (p.clip_epsilon_end - p.clip_epsilon) * progress
            self.loss.clip_epsilon = eps

    def update(self, batch: TensorDictBase) -> dict[str, float]:
        """GAE on ``batch`` then ``epochs`` of minibatch updates; returns mean diagnostics."""
        p = self.cfg.ppo
        batch = batch.to(self.device)
        norm = self.model.obs_norm
        if norm is not None and self.batches == 0:
            # fit the observation normalization; the batch was collected without it, so its
            # log-probabilities and stored states belong to another network: no update
            norm.fit(batch.get("observation"))
            keys = ["loss_objective", "loss_critic", "entropy", "kl_approx", "clip_fraction"]
            return dict.fromkeys(keys + ["grad_norm"] * (p.max_grad_norm > 0), math.nan)
        if p.reward_scale != 1.0:
            batch.set(("next", "reward"), batch.get(("next", "reward")) * p.reward_scale)
        self.gae(batch)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(p.epochs):
            for mb in minibatches(batch, p.num_minibatches, p.slice_len):
                total, stats = _loss_terms(self.loss, mb)
                self.optimizer.zero_grad(set_to_none=True)
                total.backward()
                if p.max_grad_norm > 0:
                    norm = nn.utils.clip_grad_norm_(self.model.parameters(), p.max_grad_norm)
                    stats["grad_norm"] = norm.detach()
                self.optimizer.step()
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                count += 1
        return {k: v / count for k, v in sums.items()}

    # ------------------------------------------------------------------ loop
    def train(self, *, stop_after: int | None = None, stop: Any = None) -> Path:
        """Run until ``cfg.ppo.frames`` (or ``stop_after`` frames, a simulated interruption).

        Args:
            stop: an object with ``is_set()`` (a :class:`threading.Event`), asked after every
                batch: once set, the run saves a checkpoint and returns (a clean stop on
                Ctrl-C; the checkpoint lies on a batch boundary, so resuming is exact).

        Returns the run directory.
        """
        cfg = self.cfg
        every = cfg.run.checkpoint_every
        start = time.perf_counter()
        start_frames = self.collector.frames
        limit = cfg.ppo.frames if stop_after is None else min(stop_after, cfg.ppo.frames)
        while self.collector.frames < limit:
            self._set_schedules()
            lr = self.optimizer.param_groups[0]["lr"]
            batch = next_batch(self)
            returns = episode_returns(batch)
            self.recent.extend(returns)
            stats = self.update(batch)
            self.batches += 1
            frames = self.collector.frames
            elapsed = time.perf_counter() - start
            row = {
                "frames": frames,
                "batch": self.batches,
                "episodes": len(returns),
                "episode_return": sum(returns) / len(returns) if returns else math.nan,
                "recent_return": sum(self.recent) / len(self.recent) if self.recent else math.nan,
                "lr": lr,
                "entropy_coef": self.loss.entropy_coef,
                "clip_epsilon": self.loss.clip_epsilon,
                **stats,
                "fps": (frames - start_frames) / max(elapsed, 1e-9),
                "time_s": elapsed,
            }
            self.logger.log(row)
            if not cfg.run.quiet:
                print(
                    f"frames {frames}/{cfg.ppo.frames} | {row['fps']:.0f} fps | return "
                    f"{row['recent_return']:.1f} (last {len(self.recent)} episodes) | "
                    f"entropy {stats['entropy']:.3f} | kl {stats['kl_approx']:.4f}",
                    flush=True,
                )
            stopping = stop is not None and stop.is_set()
            due = frames // every > (frames - cfg.ppo.frames_per_batch) // every
            if due or frames >= limit or stopping:
                ckpt.save(self.run_dir, self)
            if stopping:
                break
        self.logger.close()
        self.collector.shutdown()
        if cfg.run.plot and self.collector.frames >= cfg.ppo.frames:
            plot_learning_curve(self.run_dir, title=f"PPO {cfg.model.memory} on {cfg.env.env}")
        return self.run_dir


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    trust_checkpoint: bool = False,
    stop_after: int | None = None,
) -> Path:
    """Train PPO as configured; returns the run directory (see :class:`PPOTrainer`)."""
    trainer = PPOTrainer(cfg, resume=resume, trust_checkpoint=trust_checkpoint)
    return trainer.train(stop_after=stop_after)
