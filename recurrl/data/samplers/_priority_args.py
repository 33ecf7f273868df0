"""The arguments of the prioritized samplers (:class:`PriorityOptions`) and their checks.

:class:`~recurrl.data.samplers.PrioritizedSliceSampler` and
:class:`~recurrl.data.samplers.PrioritizedTapeSampler` take these arguments (the latter
without ``reduction`` and ``max_priority_within_buffer``) before those of the sampler they
prioritize, each holding one checked :class:`PriorityOptions`.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import torch

__all__ = ["PriorityOptions"]

REDUCTIONS = ("max", "min", "median", "mean")


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


@dataclass(frozen=True)
class PriorityOptions:
    """The arguments of the prioritized samplers, checked: the priority table and how
    priorities turn into draws and importance weights.

    Fields hold the values as given, numbers as ``float`` (``max_capacity`` as ``int``).

    Args:
        max_capacity: size of the priority table: at least the storage's ``max_size``.
        alpha: priority exponent (``0``: uniform draws).
        beta: importance-sampling exponent (``0``: all weights 1; annealed towards 1 in PER).
        eps: added to ``|value|`` so that no priority is 0 (default ``1e-8``).
        dtype: dtype of the priority table (default ``torch.float32``).
        reduction: how per-step priorities with trailing dims (e.g. ``[n, 1]`` or per-head
            ``[n, K]``) are reduced to one value per step: ``"max"`` (default), ``"min"``,
            ``"median"`` or ``"mean"``.
        eta: R2D2's mix of the per-step priorities of a sequence:
            ``eta * max + (1 - eta) * mean`` (default ``0.9``; ``1``: max, ``0``: mean).
        max_priority_within_buffer: if True, new data gets the largest priority among the
            positions still held (not the largest ever seen).
        uniform_mix: the share of the draws made uniformly over the drawable sequences, in
            ``[0, 1]`` (default ``0``: by priority alone). It bounds how much more likely a
            high-priority (e.g. never replayed) sequence is than the others, and how small an
            importance weight can get.

    Examples:
        >>> PriorityOptions(100, 1, 0.5).alpha
        1.0
        >>> PriorityOptions(100, 1, 0.5, eta=2, owner="MySampler")
        Traceback (most recent call last):
        ...
        ValueError: MySampler: expected eta in [0, 1] (the weight of the max in ...
    """

    max_capacity: int
    alpha: float
    beta: float
    eps: float = 1e-8
    dtype: torch.dtype = torch.float32
    reduction: str = "max"
    eta: float = field(default=0.9, kw_only=True)
    max_priority_within_buffer: bool = field(default=False, kw_only=True)
    uniform_mix: float = field(default=0.0, kw_only=True)
    #: the sampler the arguments are checked for, named in the errors
    owner: InitVar[str] = field(default="PrioritizedSliceSampler", kw_only=True)

    def __post_init__(self, owner: str) -> None:
        capacity = self.max_capacity
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(
                f"{owner}: expected max_capacity to be a positive int, received {capacity!r}; "
                "fix: pass the storage's max_size."
            )
        for name in ("alpha", "beta", "eps"):
            value = getattr(self, name)
            if not _number(value) or not value >= 0:
                raise ValueError(
                    f"{owner}: expected {name} to be a number >= 0, received {value!r}; fix: "
                    "e.g. alpha=0.9, beta=0.6 (R2D2), eps=1e-8."
                )
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise ValueError(
                f"{owner}: expected dtype to be a floating torch.dtype, received "
                f"{self.dtype!r}; fix: dtype=torch.float32 (or torch.float64)."
            )
        if self.reduction not in REDUCTIONS:
            raise ValueError(
                f"{owner}: expected reduction to be one of {REDUCTIONS}, received "
                f"{self.reduction!r}; fix: reduction='max'. (The mix over a slice's steps is "
                "eta=, not reduction=.)"
            )
        if not _number(self.eta) or not 0 <= self.eta <= 1:
            raise ValueError(
                f"{owner}: expected eta in [0, 1] (the weight of the max in eta * max + "
                f"(1 - eta) * mean), received {self.eta!r}; fix: eta=0.9 (R2D2)."
            )
        if not _number(self.uniform_mix) or not 0 <= self.uniform_mix <= 1:
            raise ValueError(
                f"{owner}: expected uniform_mix in [0, 1] (the share of the draw probability "
                f"spread evenly), received {self.uniform_mix!r}; fix: e.g. uniform_mix=0.5, "
                "or 0 for draws by priority alone."
            )
        checked = {
            "max_capacity": int(capacity), "alpha": float(self.alpha),
            "beta": float(self.beta), "eps": float(self.eps), "eta": float(self.eta),
            "uniform_mix": float(self.uniform_mix),
            "max_priority_within_buffer": bool(self.max_priority_within_buffer),
        }  # fmt: skip
        for name, value in checked.items():  # frozen: set once, here
            object.__setattr__(self, name, value)
