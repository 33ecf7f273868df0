"""PrioritizedTapeSampler: episodes drawn by priority^alpha, importance weights, updates,
overwrites, persistence, and everything TapeSampler guarantees about a tape."""

from __future__ import annotations

import random

import pytest
import torch

from recurrl.data import LazyTensorStorage, PrioritizedTapeSampler, TensorDictReplayBuffer
from recurrl.functional import sequence_priority
from tests.data._fake import FakeCollector
from tests.data.samplers.test_tape import MASK, check_batch, complete_episodes, episodes_data

LENGTHS = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
STARTS = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0)[:-1].tolist()])  # storage positions


def buffer(alpha=1.0, beta=1.0, *, frames=12, tapes=1, capacity=200, seed=0, **kw):
    sampler = PrioritizedTapeSampler(
        max_capacity=capacity, alpha=alpha, beta=beta, frames_per_tape=frames,
        num_tapes=tapes, generator=torch.Generator().manual_seed(seed), **kw,
    )  # fmt: skip
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler,
                                  batch_size=frames * tapes)  # fmt: skip


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_first_draws_follow_priority_to_the_alpha(alpha):
    rb = buffer(alpha, tapes=400, seed=3)
    rb.extend(episodes_data(LENGTHS, extra=5))
    priority = torch.tensor([1.0, 2, 3, 4, 5, 1, 2, 3, 4, 5])
    rb.update_priority(STARTS, priority)
    counts = torch.zeros(len(LENGTHS) + 1)
    for _ in range(5):
        first = rb.sample()["tid"].view(400, 12)[:, 0]  # each tape's first draw
        counts += torch.bincount(first, minlength=len(LENGTHS) + 1)
    assert counts[-1] == 0, "the running episode is never drawn"
    p = priority.double().pow(alpha)
    expected = counts.sum() * p / p.sum()
    chi2 = float(((counts[:-1] - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # 99.9% quantile of chi-square with 9 degrees of freedom


def test_importance_weights_match_a_hand_computation():
    rb = buffer(alpha=0.5, beta=0.7, frames=40)
    rb.extend(episodes_data([3, 4, 5]))
    rb.update_priority(torch.tensor([0, 3, 7]), torch.tensor([1.0, 4.0, 9.0]))
    sample = rb.sample()
    # P(e) ~ p^0.5 = 1, 2, 3; w = (P(e) / min P)^-0.7 = (p^0.5 / 1)^-0.7
    want = {0: 1.0, 1: 2.0**-0.7, 2: 3.0**-0.7}
    real = sample[MASK]
    for tid, w in want.items():
        steps = (sample["tid"] == tid) & real
        assert steps.any()
        torch.testing.assert_close(sample["_weight"][steps], torch.full((int(steps.sum()),), w))
    assert (sample["_weight"][~real] == 0).all(), "padding weighs nothing"


@pytest.mark.parametrize("mix", [0.5, 1.0])
def test_uniform_mix_spreads_a_share_of_the_draws_evenly(mix):
    """P(e) = (1 - u) p_e / sum + u / E for each tape's first draw (chi-square), and the
    weights (P(e) / min P)^-beta follow that P."""
    rb = buffer(1.0, beta=0.5, tapes=400, seed=3, uniform_mix=mix)
    rb.extend(episodes_data(LENGTHS, extra=5))
    priority = torch.tensor([1.0, 2, 3, 4, 5, 1, 2, 3, 4, 20])
    rb.update_priority(STARTS, priority)
    counts = torch.zeros(len(LENGTHS) + 1)
    p = priority.double()
    prob = (1 - mix) * p / p.sum() + mix / len(LENGTHS)
    for _ in range(5):
        sample = rb.sample()
        first = sample["tid"].view(400, 12)[:, 0]
        counts += torch.bincount(first, minlength=len(LENGTHS) + 1)
        real = sample[MASK]
        want = ((prob / prob.min()) ** -0.5)[sample["tid"][real]]
        torch.testing.assert_close(sample["_weight"][real].double(), want, rtol=1e-6, atol=0)
    expected = counts.sum() * prob
    chi2 = float(((counts[:-1] - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # 99.9% quantile of chi-square with 9 degrees of freedom


def test_new_data_gets_the_max_priority_and_overwrites_drop_old_priorities():
    rb = buffer(capacity=20, frames=20)
    rb.extend(episodes_data([4, 6]))
    rb.update_priority(torch.tensor([0, 4]), torch.tensor([7.0, 0.5]))
    rb.extend(episodes_data([5]))  # positions 10-14 get the largest priority so far
    assert torch.allclose(rb.sampler._priority[10:15], torch.tensor(7.0))
    rb.extend(episodes_data([8]))  # 15-19, 0-2: wraps over episode 0's first steps
    held = rb.sampler._priority
    assert torch.allclose(held[[0, 15]], torch.tensor(7.0)) and held[4] == 0.5 + 1e-8


def test_tapes_keep_every_tape_invariant_over_wraparound():
    rng = random.Random(0)
    collector = FakeCollector(3, 1, 12, seed=1)
    rb = buffer(alpha=0.9, frames=20, tapes=2, capacity=97, seed=1, step_key="t")
    sampled = 0
    for _ in range(25):  # several times around the ring, episodes across batches
        rb.extend(collector.batch(rng.randint(1, 9)))
        complete = complete_episodes(rb.storage)
        if not complete:
            continue
        sample = rb.sample()
        check_batch(sample, 2, 20, complete, "cut")
        err = torch.rand(sample.batch_size[0])
        first, prio = sequence_priority(err, sample["is_init"].reshape(-1), sample[MASK])
        rb.update_priority(sample["index"][first], prio)
        sampled += 1
    assert sampled > 10


def test_state_dict_round_trip_draws_the_same_tapes():
    a, b = buffer(seed=5, frames=10), buffer(seed=5, frames=10)
    a.extend(episodes_data([3, 4, 5, 6, 7]))
    a.update_priority(torch.tensor([0, 3, 7]), torch.tensor([0.1, 5.0, 2.0]))
    a.sample()
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.sampler._priority, b.sampler._priority)
    for _ in range(3):
        assert (a.sample()["tid"] == b.sample()["tid"]).all()
    small = buffer(capacity=100)
    with pytest.raises(ValueError, match=r"expected 100 priorities.*max_capacity=200"):
        small.sampler.load_state_dict(a.sampler.state_dict())


def test_bad_arguments_and_updates_raise_clear_errors():
    with pytest.raises(ValueError, match="PrioritizedTapeSampler: expected max_capacity"):
        PrioritizedTapeSampler(max_capacity=0, alpha=1.0, beta=1.0)
    with pytest.raises(ValueError, match="PrioritizedTapeSampler: expected eta in"):
        PrioritizedTapeSampler(max_capacity=10, alpha=1.0, beta=1.0, eta=2.0)
    with pytest.raises(TypeError):
        PrioritizedTapeSampler(max_capacity=10, alpha=1.0, beta=1.0, weight="length")
    with pytest.raises(ValueError, match=r"expected uniform_mix in \[0, 1\].*received -0.5"):
        PrioritizedTapeSampler(max_capacity=10, alpha=1.0, beta=1.0, uniform_mix=-0.5)
    rb = buffer(capacity=50)
    rb.extend(episodes_data([3, 4]))
    with pytest.raises(ValueError, match="one priority per episode start"):
        rb.update_priority(torch.tensor([0, 3]), torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="finite"):
        rb.update_priority(torch.tensor([0]), torch.tensor([float("nan")]))
    with pytest.raises(IndexError, match=r"\[0, 50\)"):
        rb.update_priority(torch.tensor([200]), torch.tensor([1.0]))
    small = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100), batch_size=10,
        sampler=PrioritizedTapeSampler(max_capacity=50, alpha=1.0, beta=1.0),
    )  # fmt: skip
    with pytest.raises(ValueError, match="max_capacity >= the storage's max_size"):
        small.extend(episodes_data([3]))
    zero = buffer(eps=0.0, frames=10)
    zero.extend(episodes_data([3, 4]))
    zero.update_priority(torch.tensor([0]), torch.tensor([0.0]))
    with pytest.raises(RuntimeError, match=r"priority 0.*eps > 0"):
        zero.sample()
