"""Whole-episode tapes whose episodes are drawn by priority (prioritized episode replay)."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase
from torch import Tensor

from recurrl.data.samplers._options import takes
from recurrl.data.samplers._priority_args import PriorityOptions
from recurrl.data.samplers._tape_args import TapeOptions
from recurrl.data.samplers.prioritized_slice import WEIGHT_KEY, PriorityTable, store_priorities
from recurrl.data.samplers.slice import MASK_KEY
from recurrl.data.samplers.tape import TapeSampler
from recurrl.data.storages.base import Storage

__all__ = ["PrioritizedTapeSampler"]


class PrioritizedTapeSampler(PriorityTable, TapeSampler):
    """A :class:`TapeSampler` that draws episodes by priority, with importance weights.

    Prioritized experience replay (Schaul et al. 2015) with the episode as the replayed
    sequence: a priority ``p_e`` is kept per stored episode (at the storage position of its
    first step), and the next episode laid on a tape is drawn with probability
    ``p_e^alpha / sum_j p_j^alpha`` among the complete episodes not yet on that tape (draws
    without replacement inside a tape, as ``TapeSampler``'s ``weight="uniform"``, which
    ``alpha=0`` gives). With ``uniform_mix = u > 0`` a share ``u`` of the probability is
    spread evenly instead: ``P(e) = (1 - u) p_e^alpha / sum_j p_j^alpha + u / E`` over the
    ``E`` drawable episodes (``u = 1``: uniform draws). Every step of an episode carries its
    importance weight under ``"_weight"``: ``w_e = (P(e) / min_j P(j))^-beta`` over the
    drawable episodes (at most 1); padding gets 0.

    **Priorities.** Data written gets the largest priority seen so far (1 until a larger one
    is set), so a new episode is drawn soon; an overwritten position gets it too.
    :meth:`update_priority` sets ``p = |value| + eps`` for episodes named by the storage
    position of their first step: with R2D2's mix over an episode's per-step TD errors,
    ``eta * max + (1 - eta) * mean``, as :func:`recurrl.functional.sequence_priority`
    computes it from a tape (every episode on a tape starts at an ``is_init``; an episode cut
    at the budget is scored on the steps replayed).

    The tape arguments are :class:`TapeSampler`'s; draws are by priority, so there is no
    ``weight`` (nor ``reduction`` or ``max_priority_within_buffer``).

    Keyword Args:
        eta: the max's weight in R2D2's mix, for the caller that reduces an episode's
            per-step TD errors (``sequence_priority(..., eta=sampler.eta)``);
            :meth:`update_priority` itself takes one value per episode.
        uniform_mix: the share of each draw's probability spread evenly over the drawable
            episodes, in ``[0, 1]`` (default ``0``: by priority alone). It bounds how much
            more likely a high-priority (e.g. never replayed) episode is than the others, and
            how small an importance weight can get: ``w_e >= u / (u + (1 - u) E P_max)``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> lengths = [3, 5, 2]
        >>> ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
        >>> t = torch.cat([torch.arange(n) for n in lengths])
        >>> last = torch.cat([torch.arange(n) == n - 1 for n in lengths])
        >>> data = TensorDict({"is_init": (t == 0).unsqueeze(-1),
        ...     ("collector", "traj_ids"): ids, ("next", "done"): last.unsqueeze(-1)}, [10])
        >>> sampler = PrioritizedTapeSampler(max_capacity=100, alpha=1.0, beta=1.0, eps=0.0,
        ...     frames_per_tape=5, generator=torch.Generator().manual_seed(0))
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=5,
        ...     sampler=sampler)
        >>> _ = rb.extend(data)
        >>> # episodes named by their first stored step (0, 3, 8): episode 2 is 4x as likely
        >>> rb.update_priority(torch.tensor([0, 3, 8]), torch.tensor([1.0, 1.0, 4.0]))
        >>> tape = rb.sample()
        >>> tape["collector", "traj_ids"], tape["_weight"]  # (4 / 1)^-1 for episode 2
        (tensor([2, 2, 1, 1, 1]), tensor([0.2500, 0.2500, 1.0000, 1.0000, 1.0000]))
    """

    @takes(PriorityOptions, TapeOptions,
           exclude=["reduction", "max_priority_within_buffer", "weight"])  # fmt: skip
    def __init__(self, priority: PriorityOptions, options: TapeOptions) -> None:
        self._configure(options)
        self._configure_priority(priority)  # a priority per episode, at its first step
        self._mass: np.ndarray | None = None  # [E] draw weights of the complete episodes
        self._min_mass = 1.0
        self._mix: tuple[float, int] = (1.0, 1)  # (sum of p^alpha, count) of the drawable

    def extend(self, storage: Storage, index: Tensor, data: TensorDictBase,
               row_start: Tensor) -> None:  # fmt: skip
        self._check_capacity(storage)
        super().extend(storage, index, data, row_start)
        self._priority[index.to("cpu", torch.int64)] = self._max_priority

    def sample(self, storage: Storage, batch_size: int) -> tuple[Tensor, dict]:
        piece_start, _, first, _, length = self._complete_episodes(storage)
        starts = torch.from_numpy(piece_start[first])  # [E] first step of every episode
        mass = self._priority[starts].double().pow(self.alpha).numpy()
        frames = self.tape_shape(batch_size)[1]
        pool = mass if self.overflow == "cut" else mass[length <= frames]
        total = float(pool.sum())
        self._mix = (total if total > 0 else 1.0, max(pool.size, 1))
        self._mass = self._mixed(mass)
        pool = self._mixed(pool)
        self._min_mass = float(pool.min()) if pool.size else 1.0
        if pool.size and not self._min_mass > 0:
            raise RuntimeError(
                "PrioritizedTapeSampler: an episode has priority 0 (eps=0 and a zero "
                "update); fix: use eps > 0 (default 1e-8)."
            )
        index, info = super().sample(storage, batch_size)
        # Every real step carries its episode's weight: episodes start at the marks.
        start = info[self.init_key].reshape(len(index), -1).any(-1).cpu()
        real = info[MASK_KEY].cpu()
        start_mass = self._mixed(self._priority[index[start]].double().pow(self.alpha))
        episode = torch.cumsum(start.long(), 0) - 1
        first_mass = start_mass[episode]  # the mass stored at each step's episode start
        weight = (first_mass / self._min_mass).pow(-self.beta) * real
        info[WEIGHT_KEY] = weight.to(self.dtype).to(storage.device)
        return index, info

    def _mixed(self, mass):
        """Draw weights from ``p^alpha`` (numpy or torch): unchanged without
        ``uniform_mix``, else ``(1 - u) p^alpha / sum + u / E`` over the drawable episodes
        (``sum`` and ``E`` of the current sample)."""
        u = self.uniform_mix
        if u == 0.0:
            return mass
        total, count = self._mix
        return (1.0 - u) * mass / total + u / count

    def _draw(self, pool: np.ndarray, length: np.ndarray, k: int) -> np.ndarray:
        assert self._mass is not None  # set by sample()
        w = torch.from_numpy(self._mass[pool])
        pick = torch.multinomial(w, k, replacement=False, generator=self.generator)
        return pool[pick.numpy()]

    def update_priority(self, index: Tensor, priority: Tensor | float) -> None:
        """Set the priority of episodes by the storage position of their first step.

        Args:
            index: ``[M]`` positions (a tape sample's ``"index"`` at its episode starts, e.g.
                ``index[first]`` with ``first`` from
                :func:`~recurrl.functional.sequence_priority`).
            priority: ``[M]`` values (a scalar is broadcast); ``p = |value| + eps``. A
                position named twice gets the mean of its values.
        """
        index = torch.as_tensor(index).detach().to("cpu", torch.int64).reshape(-1)
        value = torch.as_tensor(priority).detach().to("cpu", torch.float64)
        if value.dim() == 0:
            value = value.expand(len(index))
        value = value.reshape(-1)
        if value.shape != index.shape:
            raise ValueError(
                f"PrioritizedTapeSampler.update_priority: expected one priority per episode "
                f"start ({len(index)}), received {len(value)}; fix: reduce per-step TD errors "
                "per episode first, e.g. with recurrl.functional.sequence_priority."
            )
        _, mean = store_priorities(self._priority, index, value, self.eps,
                                   "PrioritizedTapeSampler")  # fmt: skip
        if mean.numel():
            self._max_priority = max(self._max_priority, float(mean.max()))

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self._priority_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._load_priority_state(state)
