"""SliceSampler: the invariants every slice sampler keeps, over many random buffers."""

from __future__ import annotations

import random

import pytest
import torch

from recurrl.data import (
    LazyTensorStorage,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tests.data._fake import (
    TRAJ,
    FakeCollector,
    reference_segments,
    reference_starts,
    split_slices,
)

SAMPLERS = {"with_replacement": SliceSampler, "without_replacement": SliceSamplerWithoutReplacement}


def fill(rb, collector, rng: random.Random, extends: int, drop_traj: bool = False):
    """Extend ``rb`` with ``extends`` batches of random length."""
    for _ in range(extends):
        data = collector.batch(rng.randint(1, 23))
        rb.extend(data.exclude(TRAJ) if drop_traj else data)


def check_slice(piece, slice_len: int) -> None:
    """One slice: inside one trajectory, contiguous in time, marked at both ends."""
    n = piece.batch_size[0]
    assert 1 <= n <= slice_len
    assert (piece["tid"] == piece["tid"][0]).all(), "slice crosses a trajectory"
    assert (piece["t"] == piece["t"][0] + torch.arange(n)).all(), "slice is not contiguous"
    is_init = piece["is_init"].reshape(-1)
    assert is_init[0] and not is_init[1:].any()
    for key in (("next", "truncated"), ("next", "done")):
        flag = piece[key].reshape(-1)
        assert flag[-1], f"{key} not set at the slice end"
        assert (flag[:-1] == (piece["t"][:-1] == -1)).all()  # stored flags are False inside


def check_sample(sample, num_slices: int, slice_len: int, strict: bool, pad: bool) -> None:
    if pad:
        assert sample.batch_size == (num_slices * slice_len,)
        mask = sample["collector", "mask"].view(num_slices, slice_len)
        lengths = mask.sum(-1)
        assert (mask == (torch.arange(slice_len) < lengths.unsqueeze(-1))).all()
        rows = sample.view(num_slices, slice_len)
        for row, n in zip(rows, lengths.tolist(), strict=True):
            check_slice(row[:n], slice_len)
            pad_rows = row[n:].exclude("index", "is_init")  # see SliceSampler's docstring
            assert row[n:]["is_init"].all()
            for value in pad_rows.values(include_nested=True, leaves_only=True):
                assert torch.isfinite(value.float()).all() and not value.float().any()
        if strict:
            assert mask.all()
        return
    pieces = split_slices(sample)
    assert len(pieces) == num_slices
    assert sample.batch_size[0] <= num_slices * slice_len
    for piece in pieces:
        check_slice(piece, slice_len)
        if strict:
            assert piece.batch_size[0] == slice_len


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("num_envs", [None, 3])
@pytest.mark.parametrize(
    ("strict", "pad", "drop_traj"),
    [(True, False, False), (False, False, False), (False, True, False), (False, False, True),
     (True, False, True)],
)  # fmt: skip
def test_invariants_random_buffers(name, num_envs, strict, pad, drop_traj):
    """No slice crosses a trajectory or the write cursor, starts are marked is_init, ends
    truncated, and the cached segments equal a brute-force rescan -- through many wraps."""
    for seed in range(4):
        rng = random.Random(seed)
        capacity = rng.randint(20, 120)
        slice_len = rng.randint(1, 9)
        num_slices = rng.randint(1, 6)
        sampler = SAMPLERS[name](slice_len=slice_len, strict_length=strict, pad_output=pad)
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler,
                                    batch_size=num_slices * slice_len)  # fmt: skip
        collector = FakeCollector(num_envs, 1, 3 * slice_len, seed)
        for _ in range(8):
            fill(rb, collector, rng, rng.randint(1, 4), drop_traj)
            segs = sampler._sync(rb.storage)
            got = list(zip(segs.starts.tolist(), segs.lengths.tolist(), strict=True))
            assert got == reference_segments(rb.storage)
            valid = reference_starts(rb.storage, slice_len, strict)
            if not valid:
                with pytest.raises(RuntimeError, match="slice_len"):
                    rb.sample()
                continue
            sample = rb.sample()
            n = sample.batch_size[0] // slice_len if pad else len(split_slices(sample))
            assert n == num_slices or (name == "without_replacement" and n < num_slices)
            check_sample(sample, n, slice_len, strict, pad)
            first = sample["index"][sample["is_init"].reshape(-1)]
            assert set(first.tolist()) <= valid


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("num_envs", [None, 2])
def test_uniform_coverage_of_valid_starts(strict, num_envs):
    """Start positions are uniform over the valid starts (chi-square within 6 sigma)."""
    torch.manual_seed(0)
    rng = random.Random(1)
    slice_len = 4
    sampler = SliceSampler(slice_len=slice_len, strict_length=strict)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(90), sampler=sampler)
    fill(rb, FakeCollector(num_envs, 1, 12, 1), rng, 12)  # wraps several times
    valid = sorted(reference_starts(rb.storage, slice_len, strict))
    draws = 400 * len(valid)
    sample = rb.sample(draws * slice_len)
    starts = sample["index"][sample["is_init"].reshape(-1)]
    assert starts.numel() == draws
    counts = torch.bincount(starts, minlength=rb.storage.max_size).float()
    assert set(starts.tolist()) == set(valid)
    expected = draws / len(valid)
    chi2 = float(((counts[valid] - expected) ** 2 / expected).sum())
    dof = len(valid) - 1
    assert abs(chi2 - dof) < 6 * (2 * dof) ** 0.5


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("pad", [False, True])
def test_min_slice_len_starts_and_lengths(name, pad):
    """min_slice_len=m: starts are the steps with >= m steps left in their segment (plus the
    first step of shorter segments); slices run to slice_len or the segment end."""
    for seed in range(4):
        rng = random.Random(seed)
        slice_len = rng.randint(2, 9)
        min_len = rng.randint(1, slice_len)
        sampler = SAMPLERS[name](slice_len=slice_len, strict_length=False, pad_output=pad,
                                 min_slice_len=min_len)  # fmt: skip
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(rng.randint(20, 120)),
                                    sampler=sampler, batch_size=5 * slice_len)  # fmt: skip
        collector = FakeCollector(3, 1, 3 * slice_len, seed)
        for _ in range(6):
            fill(rb, collector, rng, rng.randint(1, 4))
            sample = rb.sample()
            n = sample.batch_size[0] // slice_len if pad else len(split_slices(sample))
            check_sample(sample, n, slice_len, strict=False, pad=pad)
            segments = {start: length for start, length in reference_segments(rb.storage)}
            left = {}  # steps from each stored position to its segment end
            for start, length in segments.items():
                for k in range(length):
                    left[(start + k) % rb.storage.max_size] = length - k
            valid = reference_starts(rb.storage, min_len, strict=False)
            real = sample["collector", "mask"] if pad else torch.ones(sample.batch_size, dtype=bool)
            is_init = sample["is_init"].reshape(-1) & real
            starts = sample["index"][is_init].tolist()
            assert set(starts) <= valid
            lengths = (real.view(n, slice_len).sum(-1).tolist() if pad
                       else [p.batch_size[0] for p in split_slices(sample)])  # fmt: skip
            for start, length in zip(starts, lengths, strict=True):
                assert length == min(slice_len, left[start])


def test_min_slice_len_one_starts_uniformly_at_every_step():
    """m = 1: every stored step is a start, equally often (chi-square within 6 sigma), so a
    trajectory's last step is in as many slices as an inner step."""
    torch.manual_seed(0)
    sampler = SliceSampler(slice_len=4, strict_length=False, min_slice_len=1)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(90), sampler=sampler)
    fill(rb, FakeCollector(2, 1, 12, 1), random.Random(1), 12)
    draws = 400 * 90
    sample = rb.sample(draws * 4)
    starts = sample["index"][sample["is_init"].reshape(-1)]
    assert starts.numel() == draws
    counts = torch.bincount(starts, minlength=90).float()
    chi2 = float(((counts - draws / 90) ** 2 / (draws / 90)).sum())
    assert abs(chi2 - 89) < 6 * (2 * 89) ** 0.5
    covered = torch.zeros(90)  # how many slices hold each step
    covered.index_add_(0, sample["index"], torch.ones(sample.batch_size[0]))
    last = sample["index"][sample["next", "done"].reshape(-1)]
    assert (covered > 0).all() and last.unique().numel() > 1


def test_min_slice_len_default_keeps_whole_slices():
    data = FakeCollector(None, 100, 100, 0).batch(30)
    for sampler in (SliceSampler(slice_len=5), SliceSampler(slice_len=5, min_slice_len=5)):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=sampler,
                                    batch_size=500)  # fmt: skip
        rb.extend(data)
        assert (rb.sample()["index"].view(-1, 5)[:, 0] <= 25).all()


def test_slices_wrap_around_the_storage_end():
    """A trajectory written across position max_size-1 -> 0 is sampled as one time line."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                sampler=SliceSampler(slice_len=6), batch_size=600)  # fmt: skip
    collector = FakeCollector(None, 100, 100, 0)  # one long trajectory
    rb.extend(collector.batch(7))
    rb.extend(collector.batch(7))  # positions 7, 8, 9, 0, 1, 2, 3; cursor at 4
    sample = rb.sample()
    rows = sample["index"].view(-1, 6)
    assert ((rows == 9).any(-1) & (rows == 0).any(-1)).any(), "no slice wrapped"
    check_sample(sample, 100, 6, strict=True, pad=False)
    assert not (rows == 3).any(-1).logical_and((rows == 4).any(-1)).any()  # cursor


def test_cursor_is_never_crossed():
    """The newest step (cursor - 1) is never followed by the oldest (cursor)."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12),
                                sampler=SliceSampler(slice_len=3), batch_size=300)  # fmt: skip
    collector = FakeCollector(None, 100, 100, 0)
    for _ in range(5):
        rb.extend(collector.batch(5))
    cursor = rb.storage.cursor
    segs = rb.sampler._segments
    assert segs.starts.tolist() == [cursor] and segs.lengths.tolist() == [12]
    rows = rb.sample()["index"].view(-1, 3)
    newest = (cursor - 1) % 12
    assert not (rows[:, :-1] == newest).any()


def test_multi_env_rows_never_join_in_end_key_mode():
    """Without traj ids, the end of one env's row and the next env's row stay apart."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                sampler=SliceSampler(slice_len=2), batch_size=200)  # fmt: skip
    data = FakeCollector(4, 50, 50, 0).batch(5).exclude(TRAJ)  # no env is done
    rb.extend(data)
    assert rb.sampler._segments.lengths.tolist() == [5, 5, 5, 5]
    check_sample(rb.sample(), 100, 2, strict=True, pad=False)


def test_single_env_trajectory_continues_across_extends():
    collector = FakeCollector(None, 30, 30, 0)
    for drop in (False, True):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                    sampler=SliceSampler(slice_len=2))  # fmt: skip
        batch1, batch2 = collector.batch(10), collector.batch(10)
        for data in (batch1, batch2):
            rb.extend(data.exclude(TRAJ) if drop else data)
        assert sum(rb.sampler._segments.lengths.tolist()) == 20
        assert rb.sampler._segments.lengths.size == len(reference_segments(rb.storage))


def test_num_slices_gives_slice_len():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(200),
                                sampler=SliceSampler(num_slices=4), batch_size=20)  # fmt: skip
    rb.extend(FakeCollector(2, 30, 40, 0).batch(60))
    sample = rb.sample()
    assert sample.batch_size == (20,)
    assert sample["is_init"].reshape(-1).nonzero().reshape(-1).tolist() == [0, 5, 10, 15]


def test_marks_without_is_init_or_flags_in_storage():
    """Storage without is_init / truncated: truncated and done are created at slice ends."""
    data = FakeCollector(None, 50, 50, 0).batch(20)
    data = data.exclude("is_init", ("next", "truncated"), ("next", "done"))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50),
                                sampler=SliceSampler(slice_len=5), batch_size=10)  # fmt: skip
    rb.extend(data)
    sample = rb.sample()
    assert "is_init" not in sample
    assert sample["next", "truncated"].view(2, 5)[:, -1].all()
    assert sample["next", "done"].view(2, 5).sum() == 2


def test_explicit_keys():
    data = FakeCollector(2, 3, 6, 0).batch(20)
    data["my_ids"] = data["tid"]
    data["my_end"] = data["next", "done"]
    for kwargs in ({"traj_key": "my_ids"}, {"end_key": "my_end"}):
        sampler = SliceSampler(slice_len=2, **kwargs)
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler)
        rb.extend(data.exclude(TRAJ, ("next", "done")))
        assert [tuple(x) for x in zip(rb.sampler._segments.starts.tolist(),
                                      rb.sampler._segments.lengths.tolist(), strict=True)] \
            == reference_segments(rb.storage)  # fmt: skip


def test_errors_at_use():
    storage = LazyTensorStorage(10)
    with pytest.raises(ValueError, match="multiple of slice_len=4"):
        TensorDictReplayBuffer(storage=storage, sampler=SliceSampler(slice_len=4), batch_size=6)
    rb = TensorDictReplayBuffer(storage=storage, sampler=SliceSampler(slice_len=4), batch_size=8)
    with pytest.raises(RuntimeError, match="storage is empty"):
        rb.sample()
    data = FakeCollector(None, 2, 2, 0).batch(6)
    with pytest.raises(KeyError, match="traj_ids"):
        rb.extend(data.exclude(TRAJ, ("next", "done")))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                sampler=SliceSampler(slice_len=4), batch_size=8)  # fmt: skip
    rb.extend(data)
    with pytest.raises(RuntimeError, match="at most 2 steps"):
        rb.sample()
    sampler = SliceSampler(num_slices=2, strict_length=False, min_slice_len=5)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=8)
    rb.extend(data)
    with pytest.raises(ValueError, match="min_slice_len=5, slice_len=4"):
        rb.sample()


# -- keys: both given, auto-detection, boundaries given as tensors --------------------------


def _ids_and_ends(data):
    data = data.clone()
    data["my_ids"] = data["tid"]
    data["my_end"] = data["next", "done"]
    return data.exclude(TRAJ, ("next", "done"))


def _segments_of(sampler):
    segs = sampler._segments
    return list(zip(segs.starts.tolist(), segs.lengths.tolist(), strict=True))


def test_traj_key_preferred_end_key_as_fallback():
    data = _ids_and_ends(FakeCollector(2, 3, 6, 0).batch(20))
    sampler = SliceSampler(slice_len=2, end_key="my_end", traj_key="my_ids")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler)
    rb.extend(data)
    assert sampler._mode == "traj" and sampler.traj_key == "my_ids"
    assert _segments_of(sampler) == reference_segments(rb.storage)
    sampler = SliceSampler(slice_len=2, end_key="my_end", traj_key="my_ids")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler)
    rb.extend(data.exclude("my_ids"))
    assert sampler._mode == "end" and sampler.end_key == "my_end"
    assert _segments_of(sampler) == reference_segments(rb.storage)


@pytest.mark.parametrize(
    ("drop", "rename", "mode", "key"),
    [
        ((), None, "traj", TRAJ),  # collector ids first, even when "episode" is stored too
        ((TRAJ,), "episode", "traj", "episode"),
        ((TRAJ,), None, "end", ("next", "done")),
    ],
)
def test_trajectory_key_is_detected_and_reported(drop, rename, mode, key):
    data = FakeCollector(2, 3, 6, 0).batch(20)
    data["episode"] = data["tid"] + 100
    if rename is None:
        data = data.exclude("episode")
    sampler = SliceSampler(slice_len=2)
    assert sampler.traj_key is None and sampler.end_key is None
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler)
    if drop == () and rename is None:
        data["episode"] = torch.zeros_like(data["tid"])  # would join trajectories if used
    rb.extend(data.exclude(*drop))
    assert sampler._mode == mode
    assert (sampler.traj_key if mode == "traj" else sampler.end_key) == key
    assert _segments_of(sampler) == reference_segments(rb.storage)
    state = sampler.state_dict()
    fresh = SliceSampler(slice_len=2)
    fresh.load_state_dict(state)
    assert (fresh.traj_key, fresh.end_key) == (sampler.traj_key, sampler.end_key)


@pytest.mark.parametrize("given", ["ends", "trajectories"])
def test_boundaries_given_as_tensors(given):
    data = FakeCollector(None, 2, 7, 0).batch(40)  # one env: a static dataset in time order
    value = data["next", "done"].reshape(-1) if given == "ends" else data["tid"] * 3
    sampler = SliceSampler(slice_len=3, **{given: value})
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler, batch_size=30)
    rb.extend(data.exclude(TRAJ, ("next", "done"), "is_init"))  # no key in the data
    sample = rb.sample()
    assert _segments_of(sampler) == reference_segments(rb.storage)
    starts = sample["index"].view(10, 3)[:, 0]
    assert set(starts.tolist()) <= reference_starts(rb.storage, 3, strict=True)
    pieces = sample.view(10, 3)
    assert (pieces["tid"] == pieces["tid"][:, :1]).all()
    rb.extend(data[:5].exclude(TRAJ, ("next", "done"), "is_init"))  # tensor now too long
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(50), sampler=SliceSampler(
        slice_len=3, **{given: value[:10]}), batch_size=3)  # fmt: skip
    rb.extend(data)
    with pytest.raises(ValueError, match="one value per stored step"):
        rb.sample()


# -- span --------------------------------------------------------------------------------


def reference_windows(storage, slice_len: int, left: int | None, right: int, strict: bool):
    """Brute force: every (start position, real length) window of the span rules."""
    windows = []
    cap = storage.max_size
    for start, n in reference_segments(storage):
        lo = 0 if left is None else -(slice_len - left)
        found = [(max(o, 0), min(o + slice_len, n) - max(o, 0)) for o in range(lo, n - right + 1)]
        if not found and not strict:
            found = [(0, min(n, slice_len))]
        windows += [((start + a) % cap, length) for a, length in found]
    return sorted(windows)


@pytest.mark.parametrize(
    ("span", "left", "right"),
    [(True, 1, 1), ((True, False), 1, 5), ((False, True), None, 1), (2, 3, 3), ((1, 0), 4, 5)],
)
@pytest.mark.parametrize("strict", [True, False])
def test_span_windows_cover_trajectory_ends(span, left, right, strict):
    """One shuffle-free epoch visits exactly the windows of the span rules: slices may be cut
    by the trajectory start (left) and end (right), never crossing either."""
    slice_len = 5
    sampler = SliceSampler(slice_len=slice_len, span=span, replacement=False, shuffle=False,
                           strict_length=strict)  # fmt: skip
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(70), sampler=sampler,
                                batch_size=4 * slice_len)  # fmt: skip
    collector = FakeCollector(3, 1, 9, 0)
    for _ in range(4):
        rb.extend(collector.batch(7))
    got = []
    for sample in rb:
        for piece in split_slices(sample):
            check_slice(piece, slice_len)
            got.append((int(piece["index"][0]), piece.batch_size[0]))
    assert sorted(got) == reference_windows(rb.storage, slice_len, left, right, strict)


@pytest.mark.parametrize(
    ("span", "reported"),
    [(False, (False, False)), (True, (True, True)), (2, (2, 2)), ((True, False), (True, False)),
     ([False, True], (False, True)), ((3, 0), (3, 0))],
)
def test_span_is_reported_as_a_left_right_pair(span, reported):
    """The reference reports span as the (left, right) pair given (a bool or int repeated)."""
    for cls in (SliceSampler, SliceSamplerWithoutReplacement):
        assert cls(slice_len=4, span=span).span == reported


def test_span_true_covers_every_step_equally():
    """span=True: inside a long trajectory, every step (first and last included) lies in
    slice_len windows, so sampling is uniform over steps."""
    data = FakeCollector(None, 30, 30, 0).batch(30)  # one trajectory of 30 steps
    sampler = SliceSampler(slice_len=4, span=True, replacement=False, shuffle=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=sampler, batch_size=8)
    rb.extend(data)
    hits = torch.zeros(30, dtype=torch.long)
    for sample in rb:
        hits += torch.bincount(sample["index"], minlength=30)
    assert (hits == 4).all()


def test_harmless_reference_arguments_are_accepted():
    sampler = SliceSampler(slice_len=2, compile={"mode": "default"}, use_gpu=True,
                           cache_values=True)  # fmt: skip
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=sampler, batch_size=4)
    rb.extend(FakeCollector(None, 3, 5, 0).batch(20))
    check_sample(rb.sample(), 2, 2, strict=True, pad=False)


# -- 2-D storages (ndim=2): slices never cross rows ---------------------------------------


def row_segments(storage) -> list[tuple[int, int]]:
    """Brute force segments of a 2-D storage: trajectory runs cut at every row start."""
    t, cap = storage.row_len, storage.max_size
    out = []
    for start, length in reference_segments(storage):
        run = [(start + k) % cap for k in range(length)]
        cuts = [i for i, p in enumerate(run) if i and p % t == 0]
        for a, b in zip([0, *cuts], [*cuts, length], strict=True):
            out.append((run[a], b - a))
    return out


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize(("drop_traj", "strict"), [(False, True), (True, False)])
@pytest.mark.parametrize("storage_cls", ["tensor", "memmap"])
def test_2d_storage_slices_stay_in_rows(name, num_envs, drop_traj, strict, storage_cls):
    from recurrl.data import LazyMemmapStorage

    cls = LazyTensorStorage if storage_cls == "tensor" else LazyMemmapStorage
    for seed in range(3):
        rng = random.Random(seed)
        steps, slice_len = rng.randint(3, 8), rng.randint(1, 4)
        storage = cls(rng.randint(steps, 60), ndim=2)
        sampler = SAMPLERS[name](slice_len=slice_len, strict_length=strict)
        rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=4 * slice_len)
        collector = FakeCollector(num_envs, 1, 3 * slice_len, seed)
        for _ in range(6):
            data = collector.batch(steps)
            if num_envs == 1:
                data = data.reshape(1, steps)
            rb.extend(data.exclude(TRAJ) if drop_traj else data)
            assert storage.shape == (storage.max_size // steps, steps)
            expected = row_segments(storage)
            assert _segments_of(sampler) == expected
            rebuilt = SAMPLERS[name](slice_len=slice_len, strict_length=strict)
            assert list(zip(*[x.tolist() for x in (
                rebuilt._sync(storage).starts, rebuilt._segments.lengths)], strict=True)) \
                == expected  # fmt: skip
            if not any(length >= slice_len for _, length in expected) and strict:
                continue
            sample = rb.sample()
            pieces = split_slices(sample)
            for piece in pieces:
                check_slice(piece, slice_len)
                assert (piece["index"] // steps == piece["index"][0] // steps).all()


# -- end_keys / init_key / step_key ---------------------------------------------------------

END_KEYS = [("next", "done"), ("next", "truncated")]


def _truncations_only(data):
    """Odd trajectories end with ``("next", "truncated")`` alone (``done`` left False), as in
    datasets that do not copy truncations into ``done``; trajectory ids are dropped."""
    data = data.exclude(TRAJ).clone()
    done = data["next", "done"]
    cut = done & (data["tid"] % 2 == 1).unsqueeze(-1)
    data["next", "truncated"] = cut
    data["next", "done"] = done & ~cut
    data["next", "terminated"] = done & ~cut
    return data


def _rename_init(data, key):
    data = data.clone()
    data[key] = data["is_init"]
    return data.exclude("is_init")


def _check_split(sample, slice_len, init_key="is_init"):
    """Cut the sample at ``init_key`` and check every slice (marks, one trajectory)."""
    renamed = sample.clone()
    renamed["is_init"] = sample[init_key]
    pieces = split_slices(renamed)
    for piece in pieces:
        check_slice(piece, slice_len)
    return pieces


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("ndim", [1, 2])
def test_end_keys_or_the_flags_in_1d_and_2d_storages(name, ndim):
    """end_keys=[done, truncated]: trajectories ended by truncated alone are cut too; with
    done alone they would be joined (checked, so the test can fail)."""
    for seed in range(3):
        rng = random.Random(seed)
        steps, slice_len = rng.randint(3, 8), rng.randint(1, 4)
        storage = LazyTensorStorage(rng.randint(steps, 60), ndim=ndim)
        sampler = SAMPLERS[name](slice_len=slice_len, end_keys=END_KEYS, strict_length=False)
        rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=4 * slice_len)
        collector = FakeCollector(2, 1, 3 * slice_len, seed)
        joined = False
        for _ in range(6):
            rb.extend(_truncations_only(collector.batch(steps)))
            expected = row_segments(storage) if ndim == 2 else reference_segments(storage)
            assert _segments_of(sampler) == expected
            if ndim == 2:  # a rescan sees the rows of a flat storage only through extend
                rebuilt = SAMPLERS[name](slice_len=slice_len, end_keys=END_KEYS)
                rebuilt._sync(storage)
                assert _segments_of(rebuilt) == expected
            done_only = SliceSampler(slice_len=slice_len, end_key=("next", "done"))
            joined |= len(done_only._sync(storage).lengths) < len(expected)
            for piece in _check_split(rb.sample(), slice_len):
                if ndim == 2:
                    assert (piece["index"] // steps == piece["index"][0] // steps).all()
        assert joined, "the data never ended a trajectory by truncated alone"
        assert sampler._mode == "end" and sampler.end_keys == tuple(END_KEYS)
        assert sampler.end_key is None and sampler.traj_key is None


def test_end_keys_skip_absent_keys_and_need_one():
    data = _truncations_only(FakeCollector(None, 2, 6, 0).batch(30))
    sampler = SliceSampler(slice_len=2, end_keys=[*END_KEYS, "absent", ("next", "other")])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=sampler, batch_size=4)
    rb.extend(data)
    assert sampler._boundary_keys == tuple(END_KEYS)
    assert _segments_of(sampler) == reference_segments(rb.storage)
    sampler = SliceSampler(slice_len=2, end_keys=["absent", ("next", "other")])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=sampler, batch_size=4)
    with pytest.raises(KeyError, match=r"at least one of the end keys.*end_keys="):
        rb.extend(data)  # ids are not searched either: end keys were asked for


def test_traj_key_preferred_end_keys_as_fallback():
    data = FakeCollector(2, 2, 6, 0).batch(20)
    for drop, mode in (((), "traj"), ((TRAJ,), "end")):
        sampler = SliceSampler(slice_len=2, traj_key=TRAJ, end_keys=END_KEYS)
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler)
        rb.extend(_truncations_only(data) if drop else data)
        assert sampler._mode == mode
        assert _segments_of(sampler) == reference_segments(rb.storage)
        assert sampler.traj_key == TRAJ and sampler.end_keys == tuple(END_KEYS)


def test_end_keys_state_dict_round_trip():
    """The flags the segments were cut with travel in the state; a reloaded sampler keeps
    extending incrementally with them."""
    collector = FakeCollector(None, 2, 6, 0)
    sampler = SliceSampler(slice_len=2, end_keys=END_KEYS)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler, batch_size=4)
    rb.extend(_truncations_only(collector.batch(25)))
    state = rb.state_dict()
    assert state["sampler"]["end_keys"] == list(END_KEYS)
    fresh = TensorDictReplayBuffer(storage=LazyTensorStorage(40),
                                   sampler=SliceSampler(slice_len=2), batch_size=4)  # fmt: skip
    fresh.load_state_dict(state)
    assert fresh.sampler.end_keys == tuple(END_KEYS) and fresh.sampler.end_key is None
    fresh.extend(_truncations_only(collector.batch(25)))  # wraps: incremental, not rebuilt
    assert _segments_of(fresh.sampler) == reference_segments(fresh.storage)
    _check_split(fresh.sample(), 2)


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("ndim", [1, 2])
def test_init_key_names_the_slice_start_mark(name, ndim):
    """init_key="start": slice starts are marked there (OR-ed with the stored resets);
    init_key=None: the stored flags come back as stored."""
    data = FakeCollector(3, 1, 6, 0).batch(8)
    data = data if ndim == 2 else data.reshape(-1)
    for init_key in ("start", ("collector", "start"), None):
        sampler = SAMPLERS[name](slice_len=3, init_key=init_key, strict_length=False)
        storage = LazyTensorStorage(48, ndim=ndim)
        rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=12)
        rb.extend(_rename_init(data, init_key or "start"))
        sample = rb.sample()
        assert "is_init" not in sample
        if init_key is None:
            assert (sample["start"] == storage.data["start"][sample["index"]]).all()
            continue
        pieces = _check_split(sample, 3, init_key)
        assert len(pieces) == 4


def test_init_key_marks_only_never_cuts_trajectories():
    """A stored reset flag is not a boundary (as in the reference): boundaries come from
    ids or end flags only."""
    data = FakeCollector(None, 6, 6, 0).batch(12)
    data["is_init"][3] = True  # a flag inside a trajectory
    sampler = SliceSampler(slice_len=6)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(12), sampler=sampler, batch_size=6)
    rb.extend(data)
    assert sampler._segments.lengths.tolist() == [6, 6]
    assert rb.sample()["is_init"].reshape(-1).tolist()[3]  # kept, OR-ed with the start


@pytest.mark.parametrize("name", SAMPLERS)
def test_step_key_without_fragmented_is_reported_not_read(name):
    data = FakeCollector(2, 1, 6, 0).batch(10)
    data["steps"] = data["t"]
    got = []
    for kwargs in ({}, {"step_key": "steps"}, {"step_key": None}):
        sampler = SAMPLERS[name](slice_len=2, **kwargs)
        assert sampler.step_key == kwargs.get("step_key", "step_count")
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler)
        rb.extend(data)
        got.append(_segments_of(sampler))
    assert got[0] == got[1] == got[2] == reference_segments(rb.storage)


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("ndim", [1, 2])
def test_end_keys_init_key_step_key_together(name, ndim):
    collector = FakeCollector(3, 1, 8, 1)
    sampler = SAMPLERS[name](slice_len=3, end_keys=END_KEYS, init_key="start",
                             step_key="t", strict_length=False)  # fmt: skip
    storage = LazyTensorStorage(60, ndim=ndim)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=12)
    for _ in range(5):
        data = _rename_init(_truncations_only(collector.batch(7)), "start")
        rb.extend(data)  # [N, T]: rows are written one after the other into a flat storage
        expected = row_segments(storage) if ndim == 2 else reference_segments(storage)
        assert _segments_of(sampler) == expected
        for piece in _check_split(rb.sample(), 3, "start"):
            if ndim == 2:
                assert (piece["index"] // 7 == piece["index"][0] // 7).all()
    assert (sampler.end_keys, sampler.init_key, sampler.step_key) == (tuple(END_KEYS), "start", "t")
