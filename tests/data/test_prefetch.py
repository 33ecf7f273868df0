"""ReplayBuffer(prefetch=k): batches drawn ahead in a thread (recurrl/data/_prefetch.py)."""

from __future__ import annotations

import copy
import gc
import pickle
import threading
import time

import pytest
import torch
from tensordict import TensorDict

from recurrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from recurrl.data._prefetch import Prefetcher


def _steps(n: int, start: int = 0) -> TensorDict:
    x = torch.arange(start, start + n)
    return TensorDict({"x": x, "y": x * 10}, [n])


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("recurrl-prefetch")]


def _wait_no_prefetch_thread(timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while _prefetch_threads() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    return not _prefetch_threads()


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
def test_same_batches_as_without_prefetch_on_a_fixed_buffer(storage):
    def run(prefetch):
        rb = TensorDictReplayBuffer(
            storage=storage(100),
            batch_size=7,
            prefetch=prefetch,
            generator=torch.Generator().manual_seed(3),
        )
        rb.extend(_steps(50))
        return [rb.sample() for _ in range(6)]

    for a, b in zip(run(None), run(3), strict=True):
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["index"], b["index"])


def test_slice_batches_are_the_same_too():
    def run(prefetch):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(64),
            sampler=SliceSampler(slice_len=4, end_key=("next", "done")),
            batch_size=8,
            prefetch=prefetch,
            generator=torch.Generator().manual_seed(0),
        )
        done = torch.zeros(64, 1, dtype=torch.bool)
        done[9::10] = True
        is_init = torch.zeros(64, 1, dtype=torch.bool)
        is_init[::10] = True
        data = {"x": torch.arange(64), "is_init": is_init, "next": {"done": done}}
        rb.extend(TensorDict(data, [64]))
        return [rb.sample() for _ in range(5)]

    for a, b in zip(run(None), run(2), strict=True):
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["is_init"], b["is_init"])


def test_batches_hold_the_content_when_they_were_queued():
    rb = ReplayBuffer(storage=LazyTensorStorage(1000), batch_size=200, prefetch=2)
    rb.extend(_steps(10))
    first = rb.sample()  # drawn now; two more queued from the 10 steps
    assert int(first["x"].max()) < 10
    rb.extend(_steps(990, start=10))  # waits for the queued draws first
    queued = [rb.sample() for _ in range(2)]
    assert all(int(b["x"].max()) < 10 for b in queued)  # as the reference: drawn before
    fresh = rb.sample()
    assert int(fresh["x"].max()) >= 10  # 200 draws from 1000 steps: the new ones show


def test_global_random_stream_is_left_alone():
    torch.manual_seed(0)
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=5, prefetch=2)
    rb.extend(_steps(100))
    state = torch.get_rng_state()
    for _ in range(5):
        rb.sample()
    assert torch.equal(torch.get_rng_state(), state)
    assert rb.sampler.generator is not None


def test_seeded_runs_repeat():
    def run():
        torch.manual_seed(1)
        rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=9, prefetch=3)
        rb.extend(_steps(100))
        out = [rb.sample()["x"] for _ in range(4)]
        rb.extend(_steps(20, start=100))
        out += [rb.sample()["x"] for _ in range(4)]
        return out

    for a, b in zip(run(), run(), strict=True):
        assert torch.equal(a, b)


def test_other_batch_size_and_return_info():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=4, prefetch=2)
    rb.extend(_steps(100))
    assert rb.sample()["x"].shape == (4,)
    data, info = rb.sample(11, return_info=True)
    assert data["x"].shape == (11,) and torch.equal(info["index"], data["index"])
    assert rb.sample()["x"].shape == (4,)
    assert rb.prefetch == 2


def test_an_error_of_a_draw_reaches_the_caller_of_its_batch():
    calls = []

    def flaky(td):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom in transform")
        return td

    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=1, transform=flaky)
    rb.extend(_steps(10))
    rb.sample()
    with pytest.raises(RuntimeError, match="boom in transform"):
        rb.sample()
    assert rb.sample()["x"].shape == (2,)  # the buffer goes on


def test_thread_stops_with_the_buffer():
    assert _wait_no_prefetch_thread()
    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, prefetch=2)
    rb.extend(_steps(10))
    rb.sample()
    assert len(_prefetch_threads()) == 1
    del rb
    assert _wait_no_prefetch_thread()


def test_close_is_idempotent_and_restartable():
    prefetcher = Prefetcher(2)
    assert prefetcher.get(lambda n: n * 2, 3) == 6
    assert prefetcher.queued == 2
    prefetcher.close()
    prefetcher.close()
    assert prefetcher.queued == 0 and _wait_no_prefetch_thread()
    assert prefetcher.get(lambda n: n + 1, 3) == 4
    prefetcher.close()


def test_copies_and_pickles_start_empty_and_work():
    rb = ReplayBuffer(storage=LazyTensorStorage(20), batch_size=3, prefetch=2)
    rb.extend(_steps(20))
    rb.sample()
    for clone in (copy.deepcopy(rb), pickle.loads(pickle.dumps(rb))):
        assert clone._prefetcher.queued == 0 and clone.prefetch == 2
        assert clone.sample()["x"].shape == (3,)
        clone._prefetcher.close()
    rb._prefetcher.close()


def test_transform_changes_drop_queued_batches():
    rb = ReplayBuffer(storage=LazyTensorStorage(20), batch_size=3, prefetch=2)
    rb.extend(_steps(20))
    rb.sample()
    rb.append_transform(lambda td: td.set("z", td["x"] + 1))
    assert "z" in rb.sample()  # not a batch queued before the transform


def test_concurrent_writes_never_tear_a_batch():
    rb = ReplayBuffer(storage=LazyTensorStorage(256), batch_size=64, prefetch=3)
    rb.extend(_steps(256))
    stop = threading.Event()

    def writer():
        start = 0
        while not stop.is_set():
            rb.extend(_steps(32, start=start))
            start += 32

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(50):
            batch = rb.sample()
            assert torch.equal(batch["y"], batch["x"] * 10)
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_prefetch_raises(bad):
    with pytest.raises(ValueError, match="prefetch to be an int >= 1"):
        ReplayBuffer(storage=LazyTensorStorage(10), prefetch=bad)


def test_samplers_without_replacement_are_refused():
    with pytest.raises(ValueError, match="without replacement"):
        ReplayBuffer(
            storage=LazyTensorStorage(10),
            sampler=SliceSamplerWithoutReplacement(slice_len=2),
            prefetch=2,
        )


def test_zero_and_none_mean_no_prefetch():
    for value in (0, None):
        rb = ReplayBuffer(storage=LazyTensorStorage(10), prefetch=value)
        assert rb.prefetch is None and rb.sampler.generator is None
