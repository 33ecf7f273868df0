"""``pad``'s plain layout: exact time windows between the distinct piece lengths.

The trajectory pieces, longest first, form a grid ``[P, L_max, F]`` whose rows start from the
state stored at each piece's first step. The grid is run in time windows ``[l_{k-1}, l_k)``
between consecutive distinct piece lengths, on the rows still alive in that window: the
pieces that end at ``l_k`` hand over their exact final state, the others carry theirs into
the next window. No padded step is ever computed, so any runner works (a python-native
network, or a cell kind without saturating gates), at the price of one call per distinct
length; the frozen and flush layouts merge those calls where the cell allows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from recurrl.functional.sequences import Pieces

__all__ = ["Runner", "windows_unroll"]

#: ``run(x [n, w, F], hx (each [L, n, S])) -> (y [n, w, O], hx_out)``
Runner = Callable[[Tensor, tuple[Tensor, ...]], tuple[Tensor, tuple[Tensor, ...]]]


def windows_unroll(
    x: Tensor, states: tuple[Tensor, ...], pieces: Pieces, run: Runner
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Reset-aware unroll of ``x [N, T, F]`` cut into ``pieces`` (longest first).

    Returns the output ``[N, T, O]`` and the states ``[N, T, L, S]`` exact at every trajectory
    end and zero elsewhere.
    """
    n, steps = x.shape[:2]
    lengths = pieces.lengths
    total = n * steps
    device = x.device
    # Grid of pieces, longest first: position j of piece p is flat step start[p] + j.
    offsets = torch.arange(lengths[0], device=device)
    grid_index = (pieces.start.unsqueeze(1) + offsets).clamp_(max=total - 1)
    xs = x.reshape(total, -1)[grid_index]
    hx = tuple(
        s.reshape(total, *s.shape[2:])[pieces.start].transpose(0, 1).contiguous() for s in states
    )

    # Distinct lengths in increasing order, and how many pieces are alive in each window.
    distinct = sorted(set(lengths))
    alive = [sum(1 for ln in lengths if ln >= d) for d in distinct]
    outs: list[Tensor] = []
    finals: list[tuple[Tensor, ...]] = []
    ended: list[tuple[int, int]] = []
    prev = 0
    for k, (d, n_alive) in enumerate(zip(distinct, alive, strict=True)):
        hx = tuple(h[:, :n_alive] for h in hx)
        y, hx = run(xs[:n_alive, prev:d], hx)
        outs.append(y.reshape(-1, y.shape[-1]))
        n_next = alive[k + 1] if k + 1 < len(alive) else 0
        finals.append(tuple(h[:, n_next:n_alive] for h in hx))
        ended.append((n_next, n_alive))
        prev = d

    y = torch.cat(outs)[_output_index(pieces, distinct, alive, n, steps, device)]
    rank_of_final = torch.cat([torch.arange(a, b, device=device) for a, b in ended])
    end_pos = (pieces.start + pieces.length - 1)[rank_of_final]
    new_states = []
    for k, s in enumerate(states):
        final = torch.cat([f[k] for f in finals], dim=1).transpose(0, 1)  # [P, L, S]
        flat = torch.zeros(total, *s.shape[2:], dtype=final.dtype, device=device)
        new_states.append(flat.index_copy(0, end_pos, final).reshape(s.shape))
    return y.reshape(n, steps, -1), tuple(new_states)


def _output_index(pieces, distinct: list[int], alive: list[int], n: int, steps: int, device):
    """For every flat grid step, its row in the concatenation of the windows' outputs."""
    widths = torch.tensor(
        [d - p for d, p in zip(distinct, [0, *distinct[:-1]], strict=True)], device=device
    )
    starts = torch.tensor([0, *distinct[:-1]], device=device)
    sizes = torch.tensor(alive, device=device) * widths
    base = torch.cumsum(sizes, 0) - sizes
    # rank of the piece each flat step belongs to, and the step's offset inside its piece
    rank_at_start = torch.empty(n * steps, dtype=torch.long, device=device)
    rank_at_start[pieces.start] = torch.arange(len(pieces.lengths), device=device)
    is_start = torch.zeros(n * steps, dtype=torch.bool, device=device)
    is_start[pieces.start] = True
    position = torch.arange(n * steps, device=device)
    start_of = torch.cummax(torch.where(is_start, position, 0), 0).values
    rank = rank_at_start[start_of]
    offset = position - start_of
    window = torch.searchsorted(torch.tensor(distinct, device=device), offset, right=True)
    return base[window] + rank * widths[window] + (offset - starts[window])
