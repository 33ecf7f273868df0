"""The PPO recipe: collect ``[N, T]`` batches, GAE, epochs of minibatched clipped-PPO updates.

:class:`PPOTrainer` plugs into the loop every recipe shares (:class:`~recurrl.trainers.Trainer`:
logging, progress line, checkpoints, stop requests); its hooks set the schedules of the lr,
entropy weight and clip range before each batch (functions of the frames done) and learn
from the batch (:meth:`PPOTrainer.update`). One batch:

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from recurrl.objectives import GAE, ClipPPOLoss, multiagent_ppo_loss
from recurrl.trainers.collection import make_collector
from recurrl.trainers.config import TrainConfig
from recurrl.trainers.loop import Trainer
from recurrl.trainers.models import ActorCritic, actor_critic

__all__ = ["PPOTrainer", "train"]


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
    Uses torch's global RNG (one ``randperm`` per call). The minibatches are views of one
    shuffled copy of the batch: write new keys into them, not into their tensors.
    """
    n, t = batch.batch_size
    rows = batch.reshape(n * (t // slice_len), slice_len) if slice_len else batch
    count = rows.batch_size[0]
    # one gather per epoch, then views: the minibatches of torch.randperm(count).chunk(k),
    # at a third of the cost of indexing the TensorDict once per minibatch
    shuffled = rows[torch.randperm(count)]
    yield from shuffled.split(-(-count // num_minibatches), 0)


def fast_adam(model: nn.Module) -> dict[str, bool]:
    """Adam's implementation for ``model``: ``fused`` (one kernel for all the parameters)
    where torch has it for their device and dtype (CPU and CUDA floating point), else
    ``foreach``; the per-parameter loop torch picks by default on CPU costs ~1 ms per step
    for the recipes' small networks (``benchmarks/throughput.py``)."""
    devices = {q.device.type for q in model.parameters()}
    floating = all(q.is_floating_point() for q in model.parameters())
    if floating and devices <= {"cpu", "cuda"}:
        return {"fused": True}
    return {"foreach": True}


class PPOTrainer(Trainer):
    """Builds everything from a :class:`TrainConfig` (with ``cfg.run.run_dir`` set) and runs the
    loop of :class:`~recurrl.trainers.Trainer`, which documents the arguments
    (``cfg, *, resume, trust_checkpoint, state``); see the module doc.
    """

    algo = "ppo"

    def build(self) -> None:
        """The actor-critic, GAE, the clipped loss, Adam and the collector."""
        cfg = self.cfg
        self.model = actor_critic(cfg, self.env).to(self.device)
        p = cfg.ppo
        self.gae = GAE(p.gamma, p.gae_lambda, self.model.critic)
        terms = dict(
            clip_epsilon=p.clip_epsilon, entropy_coef=p.entropy_coef, critic_coef=p.critic_coef,
            normalize_advantage=p.normalize_advantage, clip_value=p.clip_value,
        )  # fmt: skip
        if self.model.continuous:
            # the tanh-squashed Gaussian rescaled to the action bounds (the Jacobians in the
            # log-probabilities; a one-sample entropy estimate)
            terms["distribution"] = self.model.distribution
        if cfg.env.is_multiagent():  # MAPPO / IPPO: the agents' keys, per-agent GAE
            self.loss, self.gae = multiagent_ppo_loss(
                self.model.actor, self.model.critic, gamma=p.gamma, lmbda=p.gae_lambda, **terms
            )
        elif self.model.action_nvec is not None:
            self.loss = _FactorizedCategoricalPPOLoss(self.model, **terms)
        else:
            self.loss = ClipPPOLoss(self.model.actor, self.model.critic, **terms)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=p.lr, eps=1e-5, **fast_adam(self.model)
        )
        self.collector = make_collector(
            cfg, self.env, self.model.policy(), frames_per_batch=p.frames_per_batch,
            total_frames=p.frames, device=self.device,
        )  # fmt: skip

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
            agents = ("next", "agents", "reward")  # a multi-agent task learns from these
            if agents in batch.keys(include_nested=True):
                batch.set(agents, batch.get(agents) * p.reward_scale)
        self.gae(batch)
        params = [q for q in self.model.parameters() if q.requires_grad]
        rows: list[torch.Tensor] = []  # the diagnostics, read back once per batch
        names: list[str] = []
        for _ in range(p.epochs):
            for mb in minibatches(batch, p.num_minibatches, p.slice_len):
                total, stats = _loss_terms(self.loss, mb)
                self.optimizer.zero_grad(set_to_none=True)
                total.backward()
                if p.max_grad_norm > 0:
                    norm = nn.utils.clip_grad_norm_(params, p.max_grad_norm, foreach=True)
                    stats["grad_norm"] = norm.detach()
                self.optimizer.step()
                names = list(stats)
                rows.append(torch.stack([v.to(torch.float64) for v in stats.values()]))
        means = torch.stack(rows).mean(0).tolist()
        return dict(zip(names, means, strict=True))

    # ------------------------------------------------------------------ the loop's hooks
    def before_batch(self) -> dict[str, Any]:
        """Set the schedules of the next batch; their values, logged with it."""
        self._set_schedules()
        return {
            "lr": self.optimizer.param_groups[0]["lr"],
            "entropy_coef": self.loss.entropy_coef,
            "clip_epsilon": self.loss.clip_epsilon,
        }

    def learn(self, batch: TensorDictBase, logged: dict[str, Any]) -> dict[str, Any]:
        """:meth:`update` on ``batch``; the row: episodes, schedules, mean diagnostics."""
        returns = self.track_episodes(batch)
        stats = self.update(batch)
        self.batches += 1
        return {**self.episode_row(returns), **logged, **stats}

    def progress(self, row: dict[str, Any]) -> str:
        return f"entropy {row['entropy']:.3f} | kl {row['kl_approx']:.4f}"


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
