"""Tests of recurrl.collectors.multi: MultiSyncCollector / MultiAsyncCollector (and the
reference's older names) on a local Ray: the hidden-state contract across workers, the
argument mapping and refusals, the lazy import."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from recurrl.data import LazyTensorStorage, ReplayBuffer
from recurrl.testing import CountingEnv
from tests.collectors._contract import check_batches_contract
from tests.collectors.test_ray import make_policy

ray = pytest.importorskip("ray")

from recurrl.collectors import (  # noqa: E402
    MultiAsyncCollector,
    MultiaSyncDataCollector,
    MultiSyncCollector,
    MultiSyncDataCollector,
    RayCollector,
)
from recurrl.collectors.multi import _env_fns  # noqa: E402

LENGTHS = [3, 5]
T = 8
make_env = functools.partial(CountingEnv, batch_size=(2,), max_steps=LENGTHS)


def test_the_older_names_are_the_same_classes():
    assert MultiSyncDataCollector is MultiSyncCollector
    assert MultiaSyncDataCollector is MultiAsyncCollector
    assert issubclass(MultiSyncCollector, RayCollector)


# --- the contract, on a local Ray -------------------------------------------------------------
def test_sync_batches_hold_every_worker_and_keep_the_hidden_state_contract(ray_session):
    lstm, policy = make_policy()
    collector = MultiSyncCollector([make_env, make_env], policy, frames_per_batch=2 * 2 * T,
                                   total_frames=3 * 2 * 2 * T, cat_results="stack")  # fmt: skip
    try:
        got = list(collector)
    finally:
        collector.shutdown()
    assert [b.batch_size for b in got] == [torch.Size([4, T])] * 3
    workers = got[0]["collector", "worker_id"][:, 0].tolist()
    assert workers == [0, 0, 1, 1]  # worker 0's rows first, an equal part from each
    check_batches_contract(got, lstm, ids_from_zero=False)
    ids = torch.cat(got, dim=1)["collector", "traj_ids"]
    assert ((ids % 2) == torch.tensor(workers)[:, None]).all()  # worker i: i + 2k


def test_async_batches_come_per_worker_and_keep_the_hidden_state_contract(ray_session):
    lstm, policy = make_policy()
    collector = MultiaSyncDataCollector([make_env, make_env], policy, frames_per_batch=2 * T,
                                        total_frames=6 * 2 * T)  # fmt: skip
    try:
        got = list(collector)
    finally:
        collector.shutdown()
    assert len(got) == 6 and all(b.batch_size == (2, T) for b in got)
    per_worker: dict[int, list] = {}
    for batch in got:
        worker = batch["collector", "worker_id"].unique().tolist()
        assert len(worker) == 1  # a batch is one worker's
        per_worker.setdefault(worker[0], []).append(batch)
    seen: set[int] = set()
    for batches in per_worker.values():
        check_batches_contract(batches, lstm, ids_from_zero=False)
        ids = set(torch.cat(batches, dim=1)["collector", "traj_ids"].unique().tolist())
        assert not ids & seen  # never shared across workers
        seen |= ids


def test_a_replay_buffer_is_filled_by_the_workers_and_iteration_yields_none(ray_session):
    from recurrl.data import RayReplayBuffer

    _, policy = make_policy()
    rb = RayReplayBuffer(storage=LazyTensorStorage(1000), batch_size=4)
    collector = MultiSyncCollector([make_env, make_env], policy, frames_per_batch=4 * T,
                                   total_frames=2 * 4 * T, replay_buffer=rb)  # fmt: skip
    try:
        assert list(collector) == [None, None]
        assert len(rb) == 2 * 4 * T
    finally:
        collector.shutdown()
        rb.shutdown()


# --- arguments (refused before Ray starts) ----------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_frames_per_traj": 10}, TypeError, "StepCounter"),
        ({"postproc": lambda td: td}, TypeError, "postproc= is not supported"),
        ({"no_such_argument": 1}, TypeError, "unexpected keyword argument 'no_such_argument'"),
        ({"cat_results": -1}, ValueError, "hidden state into another"),
        ({"extend_buffer": False}, ValueError, "extend_buffer"),
        ({"split_trajs": True}, ValueError, "traj_ids"),
        ({"replay_buffer": ReplayBuffer(storage=LazyTensorStorage(8))}, TypeError,
         "RayReplayBuffer"),
        ({"num_workers": 3}, ValueError, "num_workers=3"),
        ({"policy_factory": lambda: None, "policy": lambda td: td}, TypeError,
         "mutually exclusive"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_before_ray_starts(kwargs, error, match):
    started = ray.is_initialized()
    with pytest.raises(error, match=match):
        MultiSyncCollector([make_env, make_env], frames_per_batch=8, **kwargs)
    assert ray.is_initialized() == started


def test_env_factories_per_worker():
    def build(**kw):
        return kw

    assert [f() for f in _env_fns("X", build, 2, {"a": 1})] == [{"a": 1}] * 2
    fns = _env_fns("X", [build, build], None, [{"a": 1}, {"a": 2}])
    assert [f() for f in fns] == [{"a": 1}, {"a": 2}]
    with pytest.raises(ValueError, match="num_workers=W"):
        _env_fns("X", build, None, None)
    with pytest.raises(TypeError, match="list of callables"):
        _env_fns("X", make_env(), None, None)
    with pytest.raises(ValueError, match="list of 2 dicts"):
        _env_fns("X", [build, build], None, [{"a": 1}])


def test_importing_the_collectors_does_not_import_ray():
    code = textwrap.dedent(
        """
        import sys
        import recurrl.collectors as c
        from recurrl.collectors import *
        assert c.SyncDataCollector is c.Collector
        assert "ray" not in sys.modules, "imported Ray"
        c.MultiaSyncDataCollector
        assert "ray" in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_ray_collector_refuses_a_replay_buffer_among_the_collector_kwargs():
    """The remote Collectors would keep their batches in their own copy of the buffer."""
    started = ray.is_initialized()
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    with pytest.raises(ValueError, match=r"may not set \['replay_buffer'\]"):
        RayCollector(make_env, frames_per_batch=8, collector_kwargs={"replay_buffer": rb})
    assert ray.is_initialized() == started


# --- start() / async_shutdown(): collection in a background thread ----------------------------
def _threads(cls) -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == f"recurrl-{cls.__name__}"]


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_start_fills_the_buffer_in_a_thread_with_whole_slices_and_leaves_nothing(
    ray_session, fail_after, cls
):
    """While the thread collects, every sampled slice is contiguous, within one trajectory
    and starts with ``is_init``; the thread stops at ``total_frames``; after
    ``async_shutdown()`` no thread is left and the workers' actors are dead."""
    from recurrl.data import RayReplayBuffer, SliceSampler
    from tests.collectors.test_ray import dead

    num_slices, slice_len = 4, 3
    rb = RayReplayBuffer(storage=LazyTensorStorage(10 * 4 * T), timeout=60,
                         sampler=SliceSampler(num_slices=num_slices),
                         batch_size=num_slices * slice_len)  # fmt: skip
    total = 12 * 4 * T
    _, policy = make_policy()  # wires is_init and the hidden state in the workers' envs
    with fail_after(180):
        collector = cls([make_env, make_env], policy, frames_per_batch=4 * T,
                        total_frames=total, replay_buffer=rb)  # fmt: skip
        try:
            handles = [w.handle for w in collector._workers]
            collector.start()
            collector.start()  # a no-op while it runs
            assert len(_threads(cls)) == 1
            with pytest.raises(RuntimeError, match=r"async_shutdown\(close_env=False\)"):
                iter(collector)
            while len(rb) < 4 * T:
                time.sleep(0.05)
            seen_counts, samples = set(), 0
            while collector.is_running() or samples < 5:
                seen_counts.add(rb.write_count)
                data = rb.sample().reshape(num_slices, slice_len)
                samples += 1
                obs = data["observation"][..., 0]
                assert (obs[:, 1:] == obs[:, :-1] + 1).all()  # contiguous steps
                ids = data["collector", "traj_ids"]
                assert (ids == ids[:, :1]).all()  # one trajectory per slice
                is_init = data["is_init"].squeeze(-1)
                assert is_init[:, 0].all() and not is_init[:, 1:].any()
            collector.async_shutdown()
            assert rb.write_count == total and collector.frames == total
            assert len(seen_counts) > 1  # sampled while the thread was writing
            assert not _threads(cls)
            assert all(dead(h) for h in handles)
            collector.async_shutdown()  # idempotent
        finally:
            collector.shutdown()
            rb.shutdown()


def test_a_thread_failure_is_raised_once_in_the_caller_and_start_needs_a_buffer(
    ray_session, fail_after
):
    from recurrl.collectors import RemoteCollectorError
    from recurrl.data import RayReplayBuffer
    from tests.collectors.test_ray import FailingEnv

    with fail_after(120):
        collector = MultiAsyncCollector([make_env], frames_per_batch=2 * T, total_frames=4 * T)
        try:
            with pytest.raises(RuntimeError, match=r"has none\. Fix: pass replay_buffer="):
                collector.start()
        finally:
            collector.shutdown()
        rb = RayReplayBuffer(storage=LazyTensorStorage(100), timeout=60)
        failing = functools.partial(FailingEnv, "raise", 6, batch_size=(2,))
        collector = MultiAsyncCollector([failing], frames_per_batch=2 * T, total_frames=-1,
                                        replay_buffer=rb)  # fmt: skip
        try:
            collector.start()
            while _threads(MultiAsyncCollector):
                time.sleep(0.05)
            with pytest.raises(RemoteCollectorError, match="broken at step 6") as info:
                collector.is_running()
            notes = "".join(getattr(info.value, "__notes__", ["background thread"]))
            assert "background thread" in notes
            assert collector.is_running() is False  # raised once
            collector.async_shutdown()  # already reported: no second raise
        finally:
            collector.shutdown()
            rb.shutdown()
