"""The ``pad`` family's cost model: every constant measured on the CPU, in one place.

Costs are in units of one (row, step) of the fused kernel, forward and backward, measured on
2 CPU cores with 1 thread (``benchmarks/recurrent_mode.py``); the plans of
:mod:`~recurrl.functional.recurrent.pad.frozen` and :mod:`~recurrl.functional.recurrent.pad.flush`
are flat around these values, so they only need to be right within a factor of about 2.

A cell kind that declares :class:`~recurrl.functional.recurrent.cell.PadGates` takes its
costs from :data:`PAD_COSTS` under its name, or from ``PadGates.costs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recurrl.functional.recurrent.config import RNNConfig

__all__ = [
    "FRESH_BYTES",
    "FRESH_COST",
    "PAD_COSTS",
    "REORDER_COST",
    "SUBSET_ROWS",
    "PadCosts",
    "fresh_memory_cost",
    "kernel_costs",
    "pad_costs",
]


@dataclass(frozen=True)
class PadCosts:
    """One cell kind's costs, in row-steps.

    Attributes:
        call_work, call_min: one fused call costs ``max(call_min, call_work / H)``.
        step_work, step_min: one time step, whatever the rows, costs
            ``max(step_min, step_work / H)``.
        gather: the gathers and scatters around the frozen windows' calls, per real
            (row, step): the gap between the plans' estimates and their measured times.
        flush_extra: the flush layout's work besides its fused call, per real (row, step):
            the gathers, and for the LSTM the recomputation of ``c``.
        fresh_memory: the kernel's workspace is one large buffer (oneDNN's LSTM), so a call
            above :data:`FRESH_BYTES` pays :data:`FRESH_COST` more per (row, step).
    """

    call_work: float
    call_min: float
    step_work: float
    step_min: float
    gather: float
    flush_extra: float
    fresh_memory: bool = False


#: oneDNN's LSTM costs ~0.6 ms per call and ~3.7 us per row-step at H = 64 (~15 us at
#: H = 256), nearly nothing per time step; torch's GRU costs ~0.25-0.5 ms per time step
#: whatever the rows and ~2.6-7 us per row-step at H = 64.
PAD_COSTS: dict[str, PadCosts] = {
    "lstm": PadCosts(
        call_work=12000.0, call_min=16.0, step_work=0.0, step_min=0.5, gather=0.3,
        flush_extra=0.5, fresh_memory=True,
    ),
    "gru": PadCosts(
        call_work=8000.0, call_min=4.0, step_work=4800.0, step_min=4.0, gather=1.0,
        flush_extra=0.4,
    ),
}  # fmt: skip

#: Assembling one frozen window's start states when pieces start inside the grid (a
#: concatenation and a gather per state, forward and backward).
REORDER_COST = 16.0
#: oneDNN's LSTM workspace takes about 64 bytes per (row, step, hidden unit), in one buffer;
#: glibc's malloc maps a buffer above 32 MiB fresh from the system at every call, and its
#: page faults cost ~25% more per (row, step) (measured at H = 64, 128, 256).
FRESH_BYTES = 32 * 2**20
FRESH_COST = 0.25
#: The flush layout rebuilds the LSTM's ``c`` on only the rows that need it (an index_select
#: of the grid's inputs and outputs instead of a matmul on every row) where they are at most
#: this share of the rows.
SUBSET_ROWS = 0.75


def pad_costs(cfg: RNNConfig) -> PadCosts:
    """The costs of ``cfg``'s cell kind (``ValueError`` for a kind ``pad`` cannot freeze)."""
    kind = cfg.kind
    gates = kind.pad
    costs = gates.costs if gates is not None and gates.costs is not None else None
    costs = costs or PAD_COSTS.get(kind.name)
    if gates is None or costs is None:
        raise ValueError(
            f"the pad family's frozen/flush layouts need PadGates and PadCosts for the "
            f"{kind.name!r} cell; it declares {'no PadGates' if gates is None else 'no costs'}. "
            f"Give the kind pad=PadGates(..., costs=PadCosts(...)), or run plain windows."
        )
    return costs


def kernel_costs(cfg: RNNConfig) -> tuple[float, float]:
    """``(call_cost, step_cost)`` of torch's CPU kernel in units of one (row, step).

    Examples:
        >>> from recurrl.functional.recurrent.config import RNNConfig
        >>> kernel_costs(RNNConfig("lstm", 3, 64))
        (187.5, 0.5)
        >>> kernel_costs(RNNConfig("gru", 3, 64))
        (125.0, 75.0)
    """
    c = pad_costs(cfg)
    hid = cfg.hidden_size
    return max(c.call_min, c.call_work / hid), max(c.step_min, c.step_work / hid)


def fresh_memory_cost(cfg: RNNConfig, row_steps: int) -> float:
    """Extra cost, in row-steps, of one fused call on ``row_steps`` (row, step) pairs.

    Examples:
        >>> from recurrl.functional.recurrent.config import RNNConfig
        >>> fresh_memory_cost(RNNConfig("lstm", 3, 256), 2048)
        0.0
        >>> fresh_memory_cost(RNNConfig("lstm", 3, 256), 2112)
        528.0
    """
    if pad_costs(cfg).fresh_memory and row_steps * cfg.hidden_size * 64 > FRESH_BYTES:
        return FRESH_COST * row_steps
    return 0.0
