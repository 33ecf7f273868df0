"""Exploration: the exploration type (tensordict's interaction type) and ``EGreedyModule``.

``ExplorationType``, ``exploration_type()`` and ``set_exploration_type`` are tensordict's
``InteractionType``, ``interaction_type()`` and ``set_interaction_type`` under the names the
reference library re-exports them with (``torchrl.envs.utils``): one switch, read by every
tensordict module (probabilistic modules, this module). They are importable from
:mod:`recurrl.envs` and :mod:`recurrl.modules` alike.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType as ExplorationType
from tensordict.nn import TensorDictModuleBase
from tensordict.nn import set_interaction_type as set_exploration_type
from tensordict.utils import NestedKey

from recurrl._compat import interaction_type as exploration_type
from recurrl.modules.q_value import action_leaf_spec

__all__ = ["EGreedyModule", "ExplorationType", "exploration_type", "set_exploration_type"]


class EGreedyModule(TensorDictModuleBase):
    """Replace each action by a random one from ``spec`` with probability ``eps``.

    Put it after a greedy policy (``TensorDictSequential(policy, EGreedyModule(...))``). It
    acts only while exploring: when :func:`exploration_type` is ``RANDOM`` or unset (the
    default); under ``set_exploration_type(ExplorationType.DETERMINISTIC)`` (or ``MODE``,
    ``MEAN``, ...) the actions pass unchanged, as in the reference. One draw per batch
    entry decides (a one-hot action is replaced as a whole).

    ``eps`` decays linearly from ``eps_init`` to ``eps_end`` over ``annealing_num_steps``
    frames, as :meth:`step` is told how many frames were collected; call it in the
    training loop (nothing warns when it is never called).

    Args:
        spec: the action spec to draw from (``env.action_spec``: ``Categorical``,
            ``OneHot``, or any spec with ``rand``; a Composite holding it under
            ``action_key``). Its shape may be the action's or a suffix of it (an unbatched
            spec for batched actions).
        eps_init: initial ``eps``, in ``[0, 1]``. Default 1.0.
        eps_end: final ``eps``, in ``[0, eps_init]``. Default 0.1.
        annealing_num_steps: frames over which ``eps`` goes from ``eps_init`` to
            ``eps_end``. Default 1000.

    Keyword Args:
        action_key: where the action is read and written. Default ``"action"``.
        action_mask_key: optional boolean mask ``[*B, n]`` of the allowed actions; random
            actions are then drawn uniformly among them (categorical / one-hot specs).
        device: device of the ``eps`` buffers (and of the random actions).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.envs import Categorical
        >>> egreedy = EGreedyModule(Categorical(4), eps_init=1.0, eps_end=0.0,
        ...                         annealing_num_steps=10)
        >>> td = TensorDict({"action": torch.zeros(1000, dtype=torch.long)}, [1000])
        >>> bool((egreedy(td.clone())["action"] != 0).any())  # eps = 1: random actions
        True
        >>> egreedy.step(5); egreedy.eps
        tensor(0.5000)
        >>> with set_exploration_type(ExplorationType.DETERMINISTIC):
        ...     bool((egreedy(td.clone())["action"] == 0).all())  # not exploring: unchanged
        True
    """

    def __init__(
        self,
        spec: Any,
        eps_init: float = 1.0,
        eps_end: float = 0.1,
        annealing_num_steps: int = 1000,
        *,
        action_key: NestedKey = "action",
        action_mask_key: NestedKey | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        owner = "EGreedyModule"
        if spec is None or not callable(getattr(spec, "rand", None)):
            raise TypeError(
                f"{owner}: expected the action spec to draw random actions from, received "
                f"{type(spec).__name__}. Fix: EGreedyModule(spec=env.action_spec, ...)."
            )
        if not 0.0 <= eps_end <= eps_init <= 1.0:
            raise ValueError(
                f"{owner}: expected 0 <= eps_end <= eps_init <= 1 (eps decreases or stays), "
                f"received eps_init={eps_init!r}, eps_end={eps_end!r}."
            )
        if isinstance(annealing_num_steps, bool) or not annealing_num_steps > 0:
            raise ValueError(
                f"{owner}: expected annealing_num_steps > 0 (frames from eps_init to eps_end), "
                f"received {annealing_num_steps!r}."
            )
        super().__init__()
        self.action_key = action_key
        self.action_mask_key = action_mask_key
        self.in_keys = [action_key] + ([action_mask_key] if action_mask_key is not None else [])
        self.out_keys = [action_key]
        leaf = action_leaf_spec(spec, action_key, owner)
        self.spec = leaf if device is None else leaf.to(device)
        self.annealing_num_steps = annealing_num_steps
        self.register_buffer("eps_init", torch.tensor(float(eps_init), device=device))
        self.register_buffer("eps_end", torch.tensor(float(eps_end), device=device))
        self.register_buffer("eps", torch.tensor(float(eps_init), device=device))

    def step(self, frames: int = 1) -> None:
        """Decay ``eps`` by ``frames`` frames' worth (never below ``eps_end``).

        ``eps <- max(eps_end, eps - frames * (eps_init - eps_end) / annealing_num_steps)``:
        ``step(n)`` is ``n`` calls of ``step(1)``, as in the reference.
        """
        if isinstance(frames, bool) or frames < 0:
            raise ValueError(f"EGreedyModule.step: expected frames >= 0, received {frames!r}.")
        decay = frames * (self.eps_init - self.eps_end) / self.annealing_num_steps
        self.eps.copy_(torch.maximum(self.eps_end, self.eps - decay))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if exploration_type() not in (ExplorationType.RANDOM, None):
            return tensordict
        action = tensordict.get(self.action_key, None)
        if action is None:
            raise KeyError(
                f"EGreedyModule: no action under {self.action_key!r}; received keys "
                f"{list(tensordict.keys(True, True))}. Fix: put the greedy policy first "
                f"(TensorDictSequential(policy, EGreedyModule(...)))."
            )
        if action.device != self.eps.device:
            raise RuntimeError(
                f"EGreedyModule: the action is on {action.device} and the module on "
                f"{self.eps.device}. Fix: EGreedyModule(..., device={str(action.device)!r})."
            )
        batch = tensordict.batch_size
        if action.shape[: len(batch)] != batch:
            raise ValueError(
                f"EGreedyModule: the action {list(action.shape)} does not start with the "
                f"TensorDict's batch dims {list(batch)}."
            )
        explore = torch.rand(batch, device=action.device) < self.eps
        explore = explore.reshape((*batch, *([1] * (action.dim() - len(batch)))))
        random = self._random_actions(tensordict, action)
        tensordict.set(self.action_key, torch.where(explore, random.to(action.dtype), action))
        return tensordict

    def _random_actions(self, tensordict: TensorDictBase, action: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        shape = spec.shape
        if action.shape[action.dim() - len(shape) :] != shape:
            raise ValueError(
                f"EGreedyModule: the action shape {list(action.shape)} does not end with the "
                f"spec shape {list(shape)}. Fix: pass the env's action spec."
            )
        lead = action.shape[: action.dim() - len(shape)]
        if self.action_mask_key is None:
            return spec.rand(lead).to(action.device)
        mask = tensordict.get(self.action_mask_key, None)
        if mask is None or mask.dtype != torch.bool:
            raise KeyError(
                f"EGreedyModule: expected a bool action mask under {self.action_mask_key!r}."
            )
        n = mask.shape[-1]
        if not bool(mask.any(-1).all()):
            raise ValueError("EGreedyModule: the action mask allows no action for some entry.")
        index = torch.multinomial(mask.reshape(-1, n).float(), 1).reshape(mask.shape[:-1])
        if action.shape == mask.shape:  # one-hot actions
            return torch.nn.functional.one_hot(index, n)
        return index

    def extra_repr(self) -> str:
        return (
            f"eps={float(self.eps):.4f}, eps_end={float(self.eps_end):.4f}, "
            f"annealing_num_steps={self.annealing_num_steps}"
        )
