"""R2D2's sequence priority: the eta mix over the kept steps of each sequence only."""

from __future__ import annotations

import itertools

import pytest
import torch

from recurrl.functional import sequence_priority


def _loop(err, is_init, keep, eta):
    """One row at a time, one sequence at a time."""
    firsts, values = [], []
    rows = err.reshape(-1, err.shape[-1]), is_init.reshape(-1, err.shape[-1])
    keeps = keep.reshape(-1, err.shape[-1])
    for r, (e, s, k) in enumerate(zip(*rows, keeps, strict=True)):
        starts = [t for t in range(len(e)) if t == 0 or s[t]] + [len(e)]
        for a, b in itertools.pairwise(starts):
            kept = [abs(float(e[t])) for t in range(a, b) if k[t]]
            if kept:
                firsts.append(r * len(e) + a)
                values.append(eta * max(kept) + (1 - eta) * sum(kept) / len(kept))
    return firsts, values


@pytest.mark.parametrize("shape", [(40,), (3, 13)])
@pytest.mark.parametrize("eta", [0.0, 0.9, 1.0])
def test_matches_a_loop(shape, eta):
    g = torch.Generator().manual_seed(0)
    err = torch.randn(shape, generator=g)
    is_init = torch.rand(shape, generator=g) < 0.2
    keep = torch.rand(shape, generator=g) < 0.6
    first, prio = sequence_priority(err, is_init, keep, eta=eta)
    ref_first, ref_values = _loop(err, is_init, keep, eta)
    assert first.tolist() == ref_first
    torch.testing.assert_close(prio, torch.tensor(ref_values))


def test_ignored_steps_may_hold_anything():
    err = torch.tensor([float("nan"), 2.0, 4.0, 1e9, 1.0])
    is_init = torch.tensor([True, False, False, True, False])
    keep = torch.tensor([False, True, True, False, True])
    first, prio = sequence_priority(err, is_init, keep)
    assert first.tolist() == [0, 3]
    torch.testing.assert_close(prio, torch.tensor([0.9 * 4 + 0.1 * 3, 1.0]))


def test_sequences_without_kept_steps_are_left_out_and_bad_input():
    first, prio = sequence_priority(torch.ones(4), torch.tensor([1, 0, 1, 0]).bool(),
                                    torch.tensor([0, 0, 1, 0]).bool())  # fmt: skip
    assert first.tolist() == [2] and prio.tolist() == [1.0]
    with pytest.raises(ValueError, match="eta"):
        sequence_priority(torch.ones(2), torch.ones(2).bool(), torch.ones(2).bool(), eta=1.5)
    with pytest.raises(ValueError, match="one shape"):
        sequence_priority(torch.ones(2), torch.ones(3).bool(), torch.ones(2).bool())
