"""PrioritizedSliceSampler: start frequencies, importance weights, priority updates (R2D2
mix, wrap-around, every index layout), persistence and argument checks."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from recurrl.data import (
    LazyTensorStorage,
    PrioritizedSliceSampler,
    ReplayBuffer,
    SliceSampler,
    TensorDictReplayBuffer,
)
from tests.data._fake import TRAJ, FakeCollector, split_slices


def steps(n: int, traj: int = 0, first: int = 0) -> TensorDict:
    """``n`` steps of trajectory ``traj``, observation = step number from ``first``."""
    return TensorDict({"obs": torch.arange(first, first + n), TRAJ: torch.full((n,), traj)}, [n])


def buffer(capacity: int, **kwargs) -> TensorDictReplayBuffer:
    kwargs = {"alpha": 1.0, "beta": 1.0, **kwargs}
    sampler = PrioritizedSliceSampler(max_capacity=capacity, **kwargs)
    return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler)


def priorities(rb) -> torch.Tensor:
    return rb.sampler.state_dict()["priority"]


def slice_starts(sample, slice_len: int) -> torch.Tensor:
    return sample["index"].view(-1, slice_len)[:, 0]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_start_frequencies_follow_priority_to_the_alpha(alpha):
    """P(start i) = p_i^alpha / sum_j p_j^alpha over the 27 valid starts (chi-square within
    6 sigma), and the draws are far from uniform when alpha > 0."""
    torch.manual_seed(0)
    rb = buffer(30, alpha=alpha, slice_len=4)
    rb.extend(steps(30))
    starts = torch.arange(27)
    p = torch.rand(27, generator=torch.Generator().manual_seed(1)) * 4 + 0.05
    rb.update_priority(starts, p)
    draws = 60_000
    counts = torch.bincount(slice_starts(rb.sample(4 * draws), 4), minlength=30).double()
    assert counts[27:].sum() == 0  # slices of 4 never start in the last 3 steps
    expected = draws * p.double().pow(alpha) / p.double().pow(alpha).sum()
    chi2 = float(((counts[:27] - expected) ** 2 / expected).sum())
    assert abs(chi2 - 26) < 6 * (2 * 26) ** 0.5
    uniform = draws / 27
    chi2_uniform = float(((counts[:27] - uniform) ** 2 / uniform).sum())
    assert (chi2_uniform > 1000) == (alpha > 0)


def test_importance_weights_match_a_hand_computation():
    """w_i = (N P(i))^-beta / max_j (N P(j))^-beta, the same on every step of a slice."""
    rb = buffer(10, alpha=0.5, beta=0.4, eps=0.01, slice_len=4,
                generator=torch.Generator().manual_seed(0))  # fmt: skip
    rb.extend(steps(10))
    p = torch.tensor([1.0, 2, 3, 4, 5, 6, 7])  # starts 0 .. 6: N = 7
    rb.update_priority(torch.arange(7), -p)  # priorities are |value| + eps
    sample = rb.sample(4 * 50)
    q = (p.double() + 0.01) ** 0.5
    prob = q / q.sum()
    w = (7 * prob) ** -0.4
    w = w / w.max()
    starts = slice_starts(sample, 4)
    weight = sample["_weight"].view(-1, 4)
    assert (weight == weight[:, :1]).all()
    torch.testing.assert_close(weight[:, 0].double(), w[starts], rtol=1e-6, atol=0)
    assert len(starts.unique()) > 3


@pytest.mark.parametrize("mix", [0.0, 0.5, 1.0])
def test_uniform_mix_draws_and_weights(mix):
    """With uniform_mix u: P(start i) = (1 - u) p_i^alpha / sum + u / N (chi-square within 6
    sigma) and w_i = (P(i) / min_j P(j))^-beta, the same on every step of a slice."""
    rb = buffer(30, alpha=1.0, beta=0.5, slice_len=4, uniform_mix=mix,
                generator=torch.Generator().manual_seed(0))  # fmt: skip
    rb.extend(steps(30))
    p = torch.rand(27, generator=torch.Generator().manual_seed(1)).double() * 4 + 0.05
    rb.update_priority(torch.arange(27), p)
    draws = 60_000
    sample = rb.sample(4 * draws)
    starts = slice_starts(sample, 4)
    prob = (1 - mix) * p / p.sum() + mix / 27
    counts = torch.bincount(starts, minlength=30).double()
    chi2 = float(((counts[:27] - draws * prob) ** 2 / (draws * prob)).sum())
    assert abs(chi2 - 26) < 6 * (2 * 26) ** 0.5
    weight = sample["_weight"].view(-1, 4)
    assert (weight == weight[:, :1]).all()
    want = (prob / prob.min()) ** -0.5
    torch.testing.assert_close(weight[:, 0].double(), want[starts], rtol=1e-6, atol=0)


def test_new_data_gets_the_max_priority_and_overwritten_starts_drop_theirs():
    rb = buffer(10, slice_len=3)
    rb.extend(steps(10))  # starts 0 .. 7
    rb.update_priority(torch.arange(8), torch.tensor([5.0, 1, 1, 1, 1, 1, 1, 0.5]))
    rb.extend(steps(4, traj=1))  # overwrites positions 0 .. 3 (start 0 had priority 5)
    p = priorities(rb)
    torch.testing.assert_close(p[:4], torch.full((4,), 5.0))  # the max seen so far
    torch.testing.assert_close(p[4:8], torch.tensor([1.0, 1, 1, 0.5]) + 1e-8)
    # The surviving part of trajectory 0 (positions 4 .. 9) and trajectory 1 (0 .. 3).
    starts = set(slice_starts(rb.sample(3 * 500), 3).tolist())
    assert starts == {0, 1, 4, 5, 6, 7}


def test_max_priority_within_buffer_forgets_overwritten_priorities():
    rb = buffer(6, slice_len=2, max_priority_within_buffer=True)
    rb.extend(steps(6))
    rb.update_priority(torch.arange(5), torch.tensor([9.0, 2, 3, 1, 1]))
    rb.extend(steps(2, traj=1))  # drops position 0 (priority 9) and 1
    torch.testing.assert_close(priorities(rb)[:2], torch.full((2,), 3.0 + 1e-8))


def test_update_after_wrap_around_reaches_slices_across_the_storage_end():
    """One trajectory written across position 9 -> 0: a slice starting at 8 reads 8, 9, 0,
    1, and the per-step update from the flat index lands on its start."""
    rb = buffer(10, slice_len=4, eta=0.9, generator=torch.Generator().manual_seed(0))
    rb.extend(steps(8))
    rb.extend(steps(4, first=8))  # positions 8, 9, 0, 1: the time line is 2 .. 9, 0, 1
    rb.update_priority(torch.tensor([8]), torch.tensor([1e6]))  # force start 8
    sample = rb.sample(8)
    assert sample["index"].tolist() == [8, 9, 0, 1, 8, 9, 0, 1]
    assert sample["obs"].tolist() == [8, 9, 10, 11, 8, 9, 10, 11]
    td = torch.tensor([1.0, -3, 2, 0, 1, 1, 1, 1])
    rb.update_priority(sample["index"], td)
    # start 8 drawn twice: the mean of its two mixes
    mixes = torch.tensor([0.9 * 3 + 0.1 * 1.5, 0.9 * 1 + 0.1 * 1])
    torch.testing.assert_close(priorities(rb)[8], mixes.mean() + 1e-8)


def sample_and_td(rb, batch: int, slice_len: int):
    sample = rb.sample(batch)
    td = torch.randn(batch, generator=torch.Generator().manual_seed(2))
    num = batch // slice_len
    rows, idx = td.view(num, slice_len).abs(), sample["index"].view(num, slice_len)
    return sample, td, rows, idx


@pytest.mark.parametrize("layout", ["flat", "rows", "starts", "tensordict"])
def test_r2d2_mix_of_per_step_td_errors(layout):
    """priority = eta * max|td| + (1 - eta) * mean|td| over each slice, for every layout."""
    rb = buffer(40, slice_len=5, eta=0.7, generator=torch.Generator().manual_seed(0))
    rb.extend(steps(40))
    sample, td, rows, idx = sample_and_td(rb, 5 * 6, 5)
    starts = idx[:, 0]
    assert len(starts.unique()) == 6  # (seeded) no start drawn twice
    if layout == "flat":
        rb.update_priority(sample["index"], td)
    elif layout == "rows":
        rb.update_priority(idx, td.view(6, 5))
    elif layout == "starts":
        rb.update_priority(starts, td.view(6, 5, 1))  # a trailing dim, reduced
    else:
        sample["td_error"] = td.unsqueeze(-1)
        rb.update_tensordict_priority(sample)
    expected = 0.7 * rows.amax(-1) + 0.3 * rows.mean(-1) + 1e-8
    torch.testing.assert_close(priorities(rb)[starts], expected)


def test_mix_leaves_padding_out():
    """pad_output=True: padding (index repeating the start) is not part of the mix, whether
    the index is flat (the latest sample) or [M, T]."""
    data = FakeCollector(None, 3, 3, 0).batch(30)  # ten 3-step trajectories
    for flat in (True, False):
        sampler = PrioritizedSliceSampler(10**2, 1.0, 1.0, slice_len=5, strict_length=False,
                                          pad_output=True, eta=0.5)  # fmt: skip
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=sampler)
        rb.extend(data)
        sample = rb.sample(5 * 4)
        mask = sample["collector", "mask"].view(4, 5)
        assert (mask.sum(-1) == 3).all()
        td = torch.arange(20.0) + 1
        td[~sample["collector", "mask"]] = 100.0  # would dominate the max if mixed in
        rows = td.view(4, 5)[:, :3]
        expected = 0.5 * rows.amax(-1) + 0.5 * rows.mean(-1) + 1e-8
        index = sample["index"] if flat else sample["index"].view(4, 5)
        rb.update_priority(index, td if flat else td.view(4, 5))
        starts = sample["index"].view(4, 5)[:, 0]
        got = priorities(rb)[starts]
        if len(starts.unique()) == 4:
            torch.testing.assert_close(got, expected)
        assert (got < 50).all()
        assert (sample["_weight"].view(4, 5)[:, 3:] == 0).all()  # padding weighs nothing


def test_ragged_flat_index_of_the_latest_sample():
    """strict_length=False without padding: the flat index is cut into slices by the
    remembered layout; one value per slice is accepted as well."""
    rb = buffer(30, slice_len=4, strict_length=False, min_slice_len=1, eta=1.0,
                generator=torch.Generator().manual_seed(0))  # fmt: skip
    rb.extend(FakeCollector(None, 2, 6, 0).batch(30))
    sample = rb.sample(4 * 8)
    pieces = split_slices(sample)
    assert {p.batch_size[0] for p in pieces} != {4}  # ragged
    td = torch.randn(sample.batch_size[0])
    rb.update_priority(sample["index"], td)
    bounds = torch.tensor([0, *torch.tensor([p.batch_size[0] for p in pieces]).cumsum(0)])
    for k, piece in enumerate(pieces):
        start = int(piece["index"][0])
        assert (sample["_weight"][bounds[k] : bounds[k + 1]] > 0).all()
        if (torch.tensor([int(p["index"][0]) for p in pieces]) == start).sum() == 1:
            high = td[bounds[k] : bounds[k + 1]].abs().max()
            torch.testing.assert_close(priorities(rb)[start], high + 1e-8)
    rb.update_priority(sample["index"], torch.full((len(pieces),), 7.0))
    starts = torch.tensor([int(p["index"][0]) for p in pieces])
    torch.testing.assert_close(priorities(rb)[starts], torch.full((len(pieces),), 7.0 + 1e-8))


def test_fragmented_priorities_live_at_storage_positions():
    """fragmented=True: window ranks index the (id, step) order, priorities the ring."""
    rb = buffer(12, slice_len=2, fragmented=True, generator=torch.Generator().manual_seed(0))
    data = steps(12)
    data["traj"] = torch.tensor([0, 1] * 6)  # two interleaved trajectories
    data["step_count"] = torch.arange(12) // 2
    rb.sampler = PrioritizedSliceSampler(12, 1.0, 1.0, slice_len=2, fragmented=True,
                                         traj_key="traj")  # fmt: skip
    rb.extend(data)
    rb.update_priority(torch.tensor([7]), torch.tensor([1e6]))  # position 7: traj 1, step 3
    sample = rb.sample(2 * 10)
    assert sample["index"].view(-1, 2).tolist() == [[7, 9]] * 10


def test_state_dict_round_trip_draws_the_same_samples():
    rb = buffer(20, slice_len=3, generator=torch.Generator().manual_seed(0))
    rb.extend(steps(20))
    rb.update_priority(torch.arange(18), torch.rand(18))
    state = rb.state_dict()
    first = rb.sample(3 * 20)
    other = buffer(20, slice_len=3, generator=torch.Generator().manual_seed(5))
    other.load_state_dict(state)
    torch.testing.assert_close(other.sample(3 * 20)["index"], first["index"])
    torch.testing.assert_close(priorities(other), priorities(rb))


def test_the_weight_and_index_reach_the_sample_and_info():
    rb = buffer(10, slice_len=2, beta=0.0)
    rb.extend(steps(10))
    sample, info = rb.sample(6, return_info=True)
    assert (sample["_weight"] == 1).all() and sample["_weight"].shape == (6,)
    assert set(info) >= {"_weight", "index"}
    plain = ReplayBuffer(storage=LazyTensorStorage(10),
                         sampler=PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=2))  # fmt: skip
    plain.extend(steps(10))
    assert "_weight" in plain.sample(4)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((0, 1.0, 1.0), {}, "max_capacity"),
        ((10, -1.0, 1.0), {}, "alpha"),
        ((10, 1.0, "1"), {}, "beta"),
        ((10, 1.0, 1.0, -1e-8), {}, "eps"),
        ((10, 1.0, 1.0), {"dtype": torch.int64}, "dtype"),
        ((10, 1.0, 1.0), {"reduction": "sum"}, "reduction"),
        ((10, 1.0, 1.0), {"eta": 1.5}, "eta"),
        ((10, 1.0, 1.0), {"uniform_mix": 1.5}, r"uniform_mix in \[0, 1\]"),
        ((10, 1.0, 1.0), {"uniform_mix": True}, "uniform_mix"),
        ((10, 1.0, 1.0), {"strict_length": True, "pad_output": True}, "nothing to pad"),
        ((10, 1.0, 1.0), {"start": "stride", "start_stride": -2}, "start_stride"),
    ],
)
def test_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrioritizedSliceSampler(*args, **{"slice_len": 2, **kwargs})


def test_bad_updates_and_capacity():
    rb = buffer(10, slice_len=2)
    rb.extend(steps(10))
    with pytest.raises(ValueError, match="finite"):
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(IndexError, match="storage positions"):
        rb.update_priority(torch.tensor([10]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="to match"):
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 2, 3]))
    with pytest.raises(KeyError, match="td_error"):
        rb.update_tensordict_priority(rb.sample(4))
    sampler = PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=2)
    small = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=sampler)
    with pytest.raises(ValueError, match="max_capacity=20"):
        small.extend(steps(4))
    uniform = ReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=2))
    with pytest.raises(TypeError, match="keeps no priorities"):
        uniform.update_priority(torch.tensor([0]), torch.tensor([1.0]))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"strict_length": False},
        {"strict_length": False, "min_slice_len": 2},
        {"strict_length": False, "span": True},
        {"strict_length": False, "span": (2, False), "start": "stride", "start_stride": 2},
        {"start": "trajectory", "strict_length": False, "pad_output": True},
    ],
)
def test_window_tables_agree_with_the_slices_drawn(kwargs):
    """The cached start position of every window rank is the first real step of the slice
    that rank gives (what SliceSampler._locate computes), over a wrapped buffer."""
    sampler = PrioritizedSliceSampler(50, 1.0, 1.0, slice_len=4, **kwargs)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50), sampler=sampler)
    collector = FakeCollector(3, 1, 9, 0)
    for length in (7, 5, 9, 4):
        rb.extend(collector.batch(length))
    _, slice_len, segments, total = sampler._windows(rb.storage, 4)
    _, window_start, count, first = sampler._sync_tree(segments, slice_len, total)
    start, _ = sampler._locate(segments, torch.arange(total), slice_len)
    assert window_start.tolist() == start.tolist()
    assert count.sum() == total and (first[window_start] <= torch.arange(total)).all()
    assert (window_start[first[count > 0]] == torch.nonzero(count > 0).squeeze(-1)).all()
