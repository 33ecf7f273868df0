"""The recurrent DQN recipe: epsilon-greedy collection, replayed whole-episode tapes (or
R2D2's slices with burn-in), double DQN with a target network.

:class:`DQNTrainer` plugs into the loop every recipe shares (:class:`~recurrl.trainers.Trainer`:
logging, progress line, checkpoints, stop requests); its hooks set epsilon before each batch,
then store the batch and learn from it (:meth:`DQNTrainer.update`). One batch:

1. the :class:`~recurrl.collectors.Collector` runs the Q-network (sequential mode) in ``N``
   envs for ``T`` steps and acts epsilon-greedily (epsilon decays linearly with the frames;
   with ``epsilon_schedule="apex"`` each actor keeps its own constant epsilon, see
   :func:`apex_epsilons`); hidden states ride in the TensorDict and are stored with every
   step;
2. the ``[N, T]`` batch goes into a replay buffer (row by row: a slice never crosses rows);
3. ``updates_per_batch`` times (with ``sampler="slice"``; the default tapes are below): a
   :class:`~recurrl.data.SliceSampler` draws ``num_slices``
   slices of up to ``burn_in + train_len`` steps (``is_init`` at every slice start:
   recurrent mode restarts from the stored state there). ``min_slice_len=burn_in + 1``:
   a slice may start at any step with more than ``burn_in`` steps left in its episode and
   is cut short at the episode end, so every step after the burn-in is replayed equally
   often (with whole slices only, an episode's terminal step -- CartPole's only signal --
   would be in one slice, an inner step in ``train_len``).
   :class:`~recurrl.objectives.DQNLoss` runs the online and target Q-networks over the
   slices from the stored states and masks the first ``burn_in`` steps of each slice out of
   the loss (R2D2, Kapturowski et al. 2019: the stored state is stale, the burn-in
   refreshes it), except for slices that start an episode (``burn_in_episode_starts=False``:
   their zero state is exact; masking them would never train episodes shorter than the
   burn-in, the ones a bad greedy policy produces). Targets are ``n_steps``-step double-DQN
   returns of rewards scaled by ``reward_scale``; Adam, gradient clipping, then a soft or
   hard target-network update.

With ``sampler="tape"`` (what the default ``sampler="auto"`` picks unless a slice-only
option is set; see :class:`~recurrl.trainers.DQNConfig`), a :class:`~recurrl.data.TapeSampler`
replaces step 3's slices: ``num_tapes`` tapes of ``tape_frames`` steps, each whole complete stored
episodes laid end to end (``is_init`` at every episode start, the stored zero state there),
the one that does not fit cut at the budget and marked truncated (bootstrapped). The loss
runs with ``burn_in=0`` (every sequence starts an episode from its exact initial state) on
the flat ``[num_tapes * tape_frames]`` batch: recurrent mode restarts at every ``is_init``
and the ``n_steps`` targets stop at every episode end (a ``done`` step, the step before an
``is_init``), so nothing flows or bootstraps from one episode into the next; padded steps
(``("collector", "mask")`` False) are out of the loss. Burn-in options are refused with
tapes (:class:`~recurrl.trainers.DQNConfig`).

With ``prioritized`` (``--prioritized``), a :class:`~recurrl.data.PrioritizedTapeSampler`
draws the episodes of the tapes by priority (with ``sampler="slice"``, a
:class:`~recurrl.data.PrioritizedSliceSampler` draws the slices by priority, from the same
valid starts) and each step carries its sequence's importance weight ``"_weight"``, which
``DQNLoss`` multiplies into the step losses. The sampler is built with ``beta=1`` and the
trainer raises the weights to the annealed ``beta``
(``w(beta) = w(1)^beta`` exactly, since ``w = (p_i / p_min)^(-alpha beta)``), so the schedule
needs no call into a remote buffer. After every update each sequence's priority (an
episode's on a tape, a slice's) is set to the ``eta`` mix of the ``|TD errors|`` of its
steps in the loss (:func:`~recurrl.functional.sequence_priority`; burn-in steps do not
count).

Observations are standardized with the mean/std of the warm-up frames (``obs_norm``); the
Q-head is a one-hidden-layer MLP. Both matter on CartPole-masked: with a linear head on
raw observations the LSTM saturated its features to regress Q-values of ~50 and the
Q-function became constant across states (see ``benchmarks/learning/README.md``).

Checkpoints hold the replay buffer, the target network, the updater's counter and whether the
observation statistics were fitted besides
what :mod:`recurrl.trainers.checkpoint` saves for every recipe, so a resumed run replays the
uninterrupted one (simulators saved with ``--save-simulator``, restored with
``--trust-checkpoint``). :func:`recurrl.trainers.evaluate` acts greedily with the Q-network.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn

from recurrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    PrioritizedTapeSampler,
    SliceSampler,
    TapeSampler,
)
from recurrl.functional import sequence_priority
from recurrl.objectives import DQNLoss, HardUpdate, SoftUpdate
from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.collection import make_collector, make_replay_buffer
from recurrl.trainers.config import TrainConfig
from recurrl.trainers.encoders import observation_inputs
from recurrl.trainers.loop import Trainer
from recurrl.trainers.models import EpsilonGreedy, ObservationNorm, QNetwork

# EpsilonGreedy, ObservationNorm and QNetwork live in recurrl.trainers.models (the evaluator
# builds the Q-network too); they stay importable from here.
__all__ = ["DQNTrainer", "EpsilonGreedy", "ObservationNorm", "QNetwork", "apex_epsilons", "train"]

# policy outputs not worth replaying: the loss recomputes them (and ("next", state) too)
_NOT_STORED = ("action_value", "q_features", "q_observation", "q_encoded")


def epsilon_at(cfg: Any, frames: int) -> float:
    """Linear decay from ``cfg.eps_start`` to ``cfg.eps_end`` over ``cfg.eps_frames`` frames."""
    frac = min(1.0, frames / cfg.eps_frames)
    return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)


def apex_epsilons(n: int, base: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X's per-actor epsilons (Horgan et al. 2018, kept by R2D2): actor ``i`` of ``n``
    acts with the constant ``base ** (1 + alpha * i / (n - 1))``; a single actor with
    ``base``.

    Args:
        n: number of actors (>= 1).
        base: the epsilon of actor 0, in (0, 1].
        alpha: the spread; actor ``n - 1`` acts with ``base ** (1 + alpha)``.

    Returns:
        ``n`` epsilons, from the most exploring (actor 0) to the most greedy.

    Examples:
        >>> [round(e, 4) for e in apex_epsilons(3)]
        [0.4, 0.0162, 0.0007]
        >>> apex_epsilons(1)
        [0.4]
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"apex_epsilons: expected n an int >= 1 (the actors), received {n!r}.")
    if n == 1:
        return [float(base)]
    return [float(base) ** (1.0 + alpha * i / (n - 1)) for i in range(n)]


def importance_weights(weight: Tensor, beta: float, norm: str) -> Tensor:
    """The loss's importance weights from a prioritized sample's ``weight`` (computed for
    ``beta = 1``, divided by the global largest: ``(P / min P)^-1``): raised to ``beta``, and
    with ``norm="batch"`` divided by the sample's largest instead (padding, 0, stays 0).

    Examples:
        >>> import torch
        >>> w = torch.tensor([0.01, 0.04, 0.0])
        >>> importance_weights(w, 0.5, "global")
        tensor([0.1000, 0.2000, 0.0000])
        >>> importance_weights(w, 0.5, "batch")
        tensor([0.5000, 1.0000, 0.0000])
    """
    weight = weight.pow(beta)
    if norm == "batch":
        weight = weight / weight.max().clamp_min(torch.finfo(weight.dtype).tiny)
    return weight


def priority_beta_at(cfg: Any, frames: int) -> float:
    """Importance-weight exponent: linear from ``cfg.priority_beta`` at 0 frames to 1 at
    ``cfg.frames`` (prioritized replay's annealing)."""
    frac = min(1.0, max(frames, 0) / cfg.frames)
    return cfg.priority_beta + frac * (1.0 - cfg.priority_beta)


def make_sampler(cfg: Any) -> SliceSampler | TapeSampler:
    """The replay sampler of :class:`DQNTrainer`: slices of up to ``burn_in + train_len``
    steps that may start where ``cfg.slice_start`` says with more than ``burn_in`` steps
    left, drawn uniformly or (``cfg.prioritized``) by priority; with ``cfg.sampler ==
    "tape"`` a :class:`~recurrl.data.TapeSampler` of ``cfg.num_tapes`` tapes of
    ``cfg.tape_frames`` steps (episodes drawn by ``cfg.tape_weight`` or, prioritized, by
    priority; the one that does not fit cut at the budget).

    With ``cfg.replay_seed`` set, the sampler draws from its own generator seeded with it
    (else from torch's global stream).

    Examples:
        >>> from recurrl.trainers import DQNConfig
        >>> sampler = make_sampler(DQNConfig(sampler="tape", tape_frames=500))
        >>> type(sampler).__name__, sampler.tape_shape(1000), sampler.weight
        ('TapeSampler', (2, 500), 'uniform')
        >>> make_sampler(DQNConfig(replay_seed=3)).generator.initial_seed()
        3
    """
    generator = None
    if cfg.replay_seed is not None:
        generator = torch.Generator().manual_seed(cfg.replay_seed)
    if cfg.sampler == "tape" and cfg.prioritized:  # beta=1: annealed by the trainer
        return PrioritizedTapeSampler(
            max_capacity=cfg.buffer_size, alpha=cfg.priority_alpha, beta=1.0,
            eta=cfg.priority_eta, uniform_mix=cfg.priority_uniform_mix,
            frames_per_tape=cfg.tape_frames, num_tapes=cfg.num_tapes, generator=generator,
        )  # fmt: skip
    if cfg.sampler == "tape":
        return TapeSampler(frames_per_tape=cfg.tape_frames, num_tapes=cfg.num_tapes,
                           weight=cfg.tape_weight, generator=generator)  # fmt: skip
    kwargs: dict[str, Any] = {
        "slice_len": cfg.slice_len, "strict_length": False, "min_slice_len": cfg.burn_in + 1,
        "start": cfg.slice_start, "generator": generator,
    }  # fmt: skip
    if not cfg.prioritized:
        return SliceSampler(**kwargs)
    # beta=1: the trainer anneals it by raising the weights to beta (see the module doc)
    return PrioritizedSliceSampler(
        max_capacity=cfg.buffer_size, alpha=cfg.priority_alpha, beta=1.0,
        eta=cfg.priority_eta, uniform_mix=cfg.priority_uniform_mix, **kwargs,
    )  # fmt: skip


class DQNTrainer(Trainer):
    """Builds everything from a :class:`TrainConfig` (with ``cfg.algo == "dqn"``,
    ``cfg.run.run_dir`` set) and runs the loop of :class:`~recurrl.trainers.Trainer`,
    which documents the arguments (``cfg, *, resume, trust_checkpoint, state``); see the
    module doc.
    """

    algo = "dqn"

    def build(self) -> None:
        """The Q-network, the loss and its target update, Adam, the replay buffer and the
        collector."""
        cfg = self.cfg
        d = cfg.dqn
        inputs = observation_inputs(self.env)
        n_actions = self.env.action_spec.n
        self.model = QNetwork(cfg.model, inputs, n_actions, obs_scale=d.obs_scale)
        self.model.to(self.device)
        self.loss = DQNLoss(
            self.model.q, double_dqn=d.double_dqn, gamma=d.gamma, burn_in=d.burn_in,
            n_steps=d.n_steps, delay_value=True, loss_function=d.loss_function,
            burn_in_episode_starts=False, value_rescale=d.value_rescale,
            burn_in_stop_gradient=d.burn_in_stop_gradient,
        )  # fmt: skip
        if d.target_update == "soft":
            self.updater: HardUpdate | SoftUpdate = SoftUpdate(self.loss, tau=d.tau)
        else:
            self.updater = HardUpdate(
                self.loss, value_network_update_interval=d.hard_update_interval
            )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=d.lr)
        # --collector ray: the buffer lives in a Ray actor and the workers write to it
        self.remote = cfg.env.collector == "ray"
        acting = self._make_policies()
        self.buffer = make_replay_buffer(
            cfg,
            storage=LazyTensorStorage(d.buffer_size),
            sampler=make_sampler(d),
            batch_size=d.batch_steps,
            restore=self._checkpointed_buffer,
        )
        #: a Ray buffer was rebuilt and holds fewer steps than learning needs (see _step)
        self.refilling = False
        self._restarts_seen = 0  # the Ray buffer's rebuilds noticed so far
        self.collector = make_collector(
            cfg, self.env, acting, frames_per_batch=d.frames_per_batch,
            total_frames=d.frames, device=self.device,
            replay_buffer=self.buffer if self.remote else None,
        )  # fmt: skip
        self.normalized = False  # obs_norm fitted (its buffers are in the checkpoint)

    def _make_policies(self) -> Any:
        """Set :attr:`policy` (what the weights are read from) and :attr:`epsilons`; return
        what acts: the policy, or with ``apex`` and Ray one policy per worker, each pinned
        to its worker's epsilon (out of the synced weights, so weight updates keep it)."""
        d = self.cfg.dqn
        self.epsilons: list[float] | None = None
        if d.epsilon_schedule != "apex":
            self.policy = self.model.policy(d.eps_start)
            return self.policy
        # the actors: the Ray workers, or the envs of the local vector env
        n = self.cfg.env.workers if self.remote else self.cfg.env.num_envs
        self.epsilons = apex_epsilons(n, d.apex_epsilon, d.apex_alpha)
        if not self.remote:
            self.policy = self.model.policy(self.epsilons, pinned=True)
            return self.policy
        self.policy = self.model.policy(0.0, pinned=True)  # the learner's copy never acts
        return [self.model.policy(eps, pinned=True) for eps in self.epsilons]

    def _sync_weights(self) -> None:
        """Send the weights to the Ray workers (the local collector shares them); with apex
        each worker acts with its own policy copy, so the weights are passed explicitly."""
        weights = self.policy.state_dict() if self.remote and self.epsilons else None
        self.collector.update_policy_weights_(weights)

    # ------------------------------------------------------------------ checkpoint hooks
    def extra_state(self) -> dict[str, Any]:
        """What :mod:`~recurrl.trainers.checkpoint` saves besides the common state."""
        target = self.loss.target_value_network
        assert target is not None
        return {
            "buffer": self.buffer.state_dict(),
            "target": target.state_dict(),
            "updater_counter": getattr(self.updater, "counter", 0),
            "normalized": self.normalized,
        }

    def _checkpointed_buffer(self) -> dict[str, Any] | None:
        """The replay contents of the run's last checkpoint (``None`` before the first): what
        a rebuilt Ray buffer is refilled with."""
        if not (self.run_dir / ckpt.CHECKPOINT).is_file():
            return None
        return ckpt.load(self.run_dir).get("extra", {}).get("buffer")

    def _watch_replay(self) -> None:
        """With a Ray buffer: ask it how many steps it holds (a call of the owner, which
        rebuilds a dead actor) and keep :attr:`refilling` set after a rebuild until it holds
        what the start of the run waited for: ``learning_starts`` steps (at least one batch,
        at most the buffer's capacity)."""
        stored = len(self.buffer)
        self._replay_rebuilt()
        d = self.cfg.dqn
        if self.refilling and stored >= min(max(d.learning_starts, d.frames_per_batch),
                                            d.buffer_size):  # fmt: skip
            self.refilling = False

    def _replay_rebuilt(self) -> bool:
        """Whether the Ray buffer rebuilt its actor since the last time this was asked (by any
        call of the learner: a sample, a checkpoint ...); if so, learning waits for the refill."""
        if self.buffer.restarts == self._restarts_seen:
            return False
        self._restarts_seen, self.refilling = self.buffer.restarts, True
        return True

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.normalized = bool(state.get("normalized", False))
        assert self.loss.target_value_network is not None
        self.loss.target_value_network.load_state_dict(state["target"])
        if isinstance(self.updater, HardUpdate):
            self.updater.counter = int(state["updater_counter"])

    # ------------------------------------------------------------------ one batch
    def _set_epsilon(self) -> float:
        if self.epsilons is not None:  # apex: constant per actor; the row logs their mean
            return sum(self.epsilons) / len(self.epsilons)
        eps = epsilon_at(self.cfg.dqn, self.collector.frames)
        # the Ray workers get it with the weights (a buffer of EpsilonGreedy)
        policy = self.policy if self.remote else self.collector.policy
        for m in policy.modules():  # type: ignore[union-attr]
            if isinstance(m, EpsilonGreedy):
                m.epsilon = eps
        return eps

    def _fit_obs_norm(self) -> None:
        """Fit :attr:`QNetwork.obs_norm` to the warm-up frames (epsilon ~ 1: a nearly random
        policy); frozen from then on. A Ray buffer's frames are not in this process: they are
        estimated from ``len(buffer)`` replayed steps (slices drawn with replacement). An env
        with an image only has no vector to normalize (the CNN scales its pixels)."""
        if not self.model.obs_norm.loc.numel():
            self.normalized = True
            return
        if self.remote:
            rows, drawn = [], 0
            while drawn < len(self.buffer):
                sample = self.buffer.sample()
                real = sample.get(("collector", "mask"), None)  # padded tape steps are zeros
                rows.append(sample["observation"] if real is None else sample["observation"][real])
                drawn += sample.shape[0]
            observations = torch.cat(rows)
        else:
            observations = self.buffer.storage.data["observation"][: len(self.buffer)]
        self.model.obs_norm.fit(observations)
        self.loss.target_value_network.load_state_dict(  # type: ignore[union-attr]
            self.model.q.state_dict()
        )
        self.normalized = True

    def update(self) -> dict[str, float]:
        """``updates_per_batch`` updates on replayed slices; returns mean diagnostics."""
        d = self.cfg.dqn
        if d.anneal_lr:  # a function of the frames done, so a resumed run follows it too
            # progress before this batch: the first update runs near lr, the last above 0
            done = self.collector.frames - d.frames_per_batch
            for group in self.optimizer.param_groups:
                group["lr"] = d.lr * (1.0 - done / d.frames)
        sums = {"loss": 0.0, "td_error": 0.0, "grad_norm": 0.0}
        beta = priority_beta_at(d, self.collector.frames - d.frames_per_batch)
        done = 0
        for _ in range(d.updates_per_batch):
            sample = self._sample()
            if sample is None:  # the Ray buffer was rebuilt: learning waits for its refill
                break
            sample = sample.to(self.device)
            if d.reward_scale != 1.0:
                key = ("next", self.loss.tensor_keys.reward)
                sample.set(key, sample.get(key) * d.reward_scale)
            if d.prioritized:  # the sampler's weights are for beta = 1
                key = self.loss.tensor_keys.priority_weight
                sample.set(key, importance_weights(sample.get(key), beta, d.priority_weight_norm))
            out = self.loss(sample)
            self.optimizer.zero_grad(set_to_none=True)
            out["loss"].backward()
            if d.max_grad_norm > 0:
                norm = nn.utils.clip_grad_norm_(self.model.parameters(), d.max_grad_norm)
                sums["grad_norm"] += float(norm)
            self.optimizer.step()
            self.updater.step()
            if d.prioritized:
                self.update_priorities(sample)
            sums["loss"] += float(out["loss"].detach())
            sums["td_error"] += float(out["td_error"])
            done += 1
            if self.refilling:  # the buffer was rebuilt during the priority update
                break
        self._sync_weights()
        return {k: v / done if done else math.nan for k, v in sums.items()}

    def _sample(self) -> TensorDictBase | None:
        """A replayed batch; ``None`` when a Ray buffer's actor died and was rebuilt during
        the call (its contents went back to the last checkpoint or to nothing: the updates
        of this batch stop and :attr:`refilling` decides when they resume)."""
        if not self.remote:
            return self.buffer.sample()
        try:
            sample = self.buffer.sample()
        except RuntimeError:  # e.g. sampling the empty rebuilt buffer
            if not self._replay_rebuilt():
                raise
            return None
        return None if self._replay_rebuilt() else sample

    def update_priorities(self, sample: TensorDictBase) -> None:
        """Set the priority of every sequence (slice, or episode of a tape) of ``sample``
        (after the loss wrote its per-step ``"td_error"``): R2D2's ``eta`` mix over the
        sequence's steps in the loss only."""
        k = self.loss.tensor_keys
        is_init = sample.get(k.is_init).reshape(sample.batch_size)
        first, priority = sequence_priority(
            sample.get(k.priority), is_init, self.loss.loss_mask(sample),
            eta=self.cfg.dqn.priority_eta,
        )  # fmt: skip
        index = sample.get("index").reshape(-1)[first]
        if not self.remote:
            self.buffer.update_priority(index, priority)
            return
        try:
            self.buffer.update_priority(index, priority)
        except (RuntimeError, IndexError, ValueError):
            if not self._replay_rebuilt():  # (rebuilt: those positions hold other steps now)
                raise
        self._replay_rebuilt()

    def _step(self, batch: TensorDictBase) -> dict[str, Any]:
        """Store ``batch``, update if enough frames were collected; the metrics row."""
        returns = self.track_episodes(batch)
        if not self.remote:  # Ray workers wrote their batch into the buffer themselves
            self.buffer.extend(batch.exclude(*_NOT_STORED))
        else:
            self._watch_replay()
        learning = self.collector.frames >= self.cfg.dqn.learning_starts and not self.refilling
        if learning and self.cfg.dqn.obs_norm and not self.normalized:
            self._fit_obs_norm()
        stats = self.update() if learning else dict.fromkeys(
            ("loss", "td_error", "grad_norm"), math.nan)  # fmt: skip
        if self.remote and not learning:
            self._sync_weights()  # epsilon decays during the warm-up too
        self.batches += 1
        row = {**self.episode_row(returns), **stats}
        if self.remote:
            row["replay_restarts"] = self.buffer.restarts
        return row

    # ------------------------------------------------------------------ the loop's hooks
    def start(self) -> None:
        """With ``apex``, print each actor's epsilon (unless quiet)."""
        if self.epsilons is not None and not self.cfg.run.quiet:
            actors = "Ray worker" if self.remote else "env"
            print(f"epsilons (apex, per {actors}): " + " ".join(f"{e:.4g}" for e in self.epsilons),
                  flush=True)  # fmt: skip

    def before_batch(self) -> dict[str, Any]:
        """Set the epsilon of the next batch (logged with it)."""
        return {"epsilon": self._set_epsilon()}

    def learn(self, batch: TensorDictBase, logged: dict[str, Any]) -> dict[str, Any]:
        """Store ``batch`` and update (:meth:`_step`); the row, with the epsilon last."""
        return {**self._step(batch), **logged}

    def progress(self, row: dict[str, Any]) -> str:
        return f"epsilon {row['epsilon']:.3f} | loss {row['loss']:.4f}"

    def close(self) -> None:
        """Also shut the Ray replay buffer's actor down (``--collector ray``)."""
        super().close()
        if self.remote:
            self.buffer.shutdown()


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    trust_checkpoint: bool = False,
    stop_after: int | None = None,
) -> Path:
    """Train recurrent DQN as configured; returns the run directory (see :class:`DQNTrainer`)."""
    trainer = DQNTrainer(cfg, resume=resume, trust_checkpoint=trust_checkpoint)
    return trainer.train(stop_after=stop_after)
