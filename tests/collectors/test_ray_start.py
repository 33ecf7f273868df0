"""Start-up of a RayCollector's remote collectors (recurrl.collectors._ray_start): with
``sync=False`` fewer remote collectors than asked collect when the cluster cannot place them
all, and the missing ones join, with their own trajectory ids, once Ray starts them."""

from __future__ import annotations

import functools
import os
import sys
import time

import pytest
import torch

from recurrl.testing import CountingEnv
from tests.collectors._contract import check_batches_contract
from tests.collectors.test_ray import make_policy

ray = pytest.importorskip("ray")

from recurrl.collectors import RayCollector  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # env factories reach actors

T = 8
make_env = functools.partial(CountingEnv, batch_size=(2,), max_steps=[3, 5])


class _Hog:
    """An actor that only holds the CPUs it was created with."""

    def ready(self) -> bool:
        return True


def _leave_two_cpus() -> tuple[int, object]:
    """An actor holding all but 2 of the test cluster's CPUs (it starts once that many are
    free: CPUs of actors that earlier tests killed come back asynchronously)."""
    free = int(ray.cluster_resources().get("CPU", 0))
    if free < 3:
        pytest.skip(f"needs 3 CPUs in the test cluster, has {free}")
    hog = ray.remote(_Hog).options(num_cpus=free - 2).remote()
    ray.get(hog.ready.remote(), timeout=60)
    return free, hog


def _release(collector, hog, free: int) -> None:
    """Shut ``collector`` down and free the hog's CPUs; wait until the cluster has its
    ``free`` CPUs back, so the next tests find it as it was."""
    if collector is not None:
        collector.shutdown()
    ray.kill(hog, no_restart=True)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < free and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.parametrize("value", [-1, "soon", True])
def test_placement_timeout_is_checked_before_ray_starts(value):
    with pytest.raises(ValueError, match="placement_timeout None or a number of seconds >= 0"):
        RayCollector(make_env, frames_per_batch=8, sync=False, placement_timeout=value)


def test_fewer_workers_than_asked_collect_and_the_missing_one_joins_when_placed(
    ray_session, fail_after, caplog
):
    """3 remote collectors of 1 CPU on a cluster with 2 CPUs free: after
    ``placement_timeout`` (long enough for a loaded machine) the 2 that started collect (one
    warning says 1 of 3 and why); once the CPUs held elsewhere are freed, Ray starts the
    third, which joins: its batches start new episodes (``is_init`` at its first step), its
    trajectory ids are its slot's (never another's), and every worker's batches keep the
    hidden-state contract. A state saved while it had not started loads back."""
    free, hog = _leave_two_cpus()
    lstm, policy = make_policy()
    collector = None
    try:
        with fail_after(180), caplog.at_level("WARNING", logger="recurrl.collectors.ray"):
            collector = RayCollector(make_env, policy, frames_per_batch=2 * T, num_collectors=3,
                                     sync=False, placement_timeout=20)  # fmt: skip
            # (on a loaded machine worker 0 or 1 may also miss the 20 s: it then joins later)
            assert collector.active_collectors in (1, 2)
            lines = [r.getMessage() for r in caplog.records if "did not start" in r.getMessage()]
            assert len(lines) == 1, lines
            missing = ", ".join(str(w.index) for w in collector._workers if not w.active)
            assert (
                f"{3 - collector.active_collectors} of 3 remote collectors ({missing})"
                in (lines[0])
            )
            assert "did not start within placement_timeout=20 s" in lines[0]
            assert "'num_cpus': 1" in lines[0] and "Collecting with the " in lines[0]
            batches = iter(collector)
            got = [next(batches) for _ in range(2)]
            while len({int(b["collector", "worker_id"][0, 0]) for b in got}) < 2:
                got.append(next(batches))  # first come, first served: until both delivered
            started = {int(b["collector", "worker_id"][0, 0]) for b in got}
            assert len(started) == 2  # which one Ray left out is its choice
            (late,) = {0, 1, 2} - started
            assert collector.active_collectors == 2
            saved = collector.state_dict()  # the one not started has no collector state yet
            assert [w["collector"] is None for w in saved["workers"]] == [
                w == late for w in range(3)
            ]
            ray.kill(hog, no_restart=True)  # CPUs come back: Ray places the third
            while True:
                got.append(next(batches))
                if int(got[-1]["collector", "worker_id"][0, 0]) == late:
                    break
            for _ in range(6):  # a few more, so that each worker has several batches
                got.append(next(batches))
        assert collector.active_collectors == 3
        with fail_after(120):  # back to the saved state: the third restarts fresh, in its slot
            collector.load_state_dict(saved)
            again = iter(collector)
            after = [next(again) for _ in range(6)]
        for b in after:
            worker = int(b["collector", "worker_id"][0, 0])
            assert (b["collector", "traj_ids"] % 3 == worker).all()
        per_worker: dict[int, list] = {}
        for b in got:
            per_worker.setdefault(int(b["collector", "worker_id"][0, 0]), []).append(b)
        first = per_worker[late][0]
        assert first["is_init"][:, 0].all()  # new episodes
        seen: set[int] = set()
        for worker, batches_of in per_worker.items():
            if len(batches_of) > 1:
                check_batches_contract(batches_of, lstm, ids_from_zero=False)
            ids = torch.cat(batches_of, dim=1)["collector", "traj_ids"]
            assert (ids % 3 == worker).all()  # slot s hands out s + 3k (stride 3 + 0 restarts)
            assert not set(ids.unique().tolist()) & seen
            seen |= set(ids.unique().tolist())
    finally:
        _release(collector, hog, free)


def test_sync_without_placement_timeout_needs_every_worker_and_says_what_cannot_be_placed(
    ray_session, monkeypatch
):
    """``placement_timeout=None``: every remote collector must start, so one that Ray cannot
    place (it asks for 100 CPUs) ends the start-up with an error naming what it asks for and
    the fix, after the start timeout (shortened here), not a wait forever."""
    from recurrl.collectors import RemoteCollectorError, _ray_start

    monkeypatch.setattr(_ray_start, "MIN_START_TIMEOUT", 2.0)
    with pytest.raises(RemoteCollectorError, match="did not start within 2 s") as info:
        RayCollector(make_env, frames_per_batch=2 * T, num_collectors=2, timeout=2,
                     remote_configs=[{"num_cpus": 1}, {"num_cpus": 100}],
                     placement_timeout=None)  # fmt: skip
    text = str(info.value)
    assert "{'num_cpus': 100}" in text  # (the other may be late too on a loaded machine)
    assert "or a placement_timeout (it goes on with the remote collectors that start)" in text


def _shares(batch, rows: int = 2) -> list:
    """A sync batch cut into its shares (``rows`` env rows each), in order."""
    return [batch[i : i + rows] for i in range(0, batch.batch_size[0], rows)]


def _worker(share) -> int:
    ids = share["collector", "worker_id"]
    assert (ids == ids[0, 0]).all()
    return int(ids[0, 0])


def test_sync_goes_on_with_the_workers_that_started_and_keeps_the_batch(
    ray_session, fail_after, caplog
):
    """``sync=True``, 3 remote collectors of 1 CPU on a cluster with 2 CPUs free: after
    ``placement_timeout`` the started ones collect the missing one's share too (spread
    evenly), so every batch keeps its 3 shares of 2 envs x T steps; each collector's shares,
    in order, keep the collector contract (a second share in a batch continues the first's
    episodes and hidden states). Which collector is left out is Ray's choice. When the CPUs
    come back the missing one joins: new episodes in its own slot, and from then on one share
    each."""
    free, hog = _leave_two_cpus()
    lstm, policy = make_policy()
    collector = None
    try:
        with fail_after(180), caplog.at_level("WARNING", logger="recurrl.collectors.ray"):
            collector = RayCollector(make_env, policy, frames_per_batch=3 * 2 * T,
                                     num_collectors=3, sync=True, placement_timeout=20,
                                     update_after_each_batch=True)  # fmt: skip
            assert collector.active_collectors in (1, 2)
            lines = [r.getMessage() for r in caplog.records if "did not start" in r.getMessage()]
            assert len(lines) == 1 and "Collecting with the " in lines[0], lines
            batches = iter(collector)
            got = [next(batches) for _ in range(3)]
            for batch in got:
                assert batch.batch_size == (6, T)
                owners = [_worker(share) for share in _shares(batch)]
                # 2 CPUs: never 3 collectors at once (which one Ray left out is its choice)
                assert len(set(owners)) <= 2 and owners == sorted(owners)
                counts = [owners.count(w) for w in set(owners)]
                assert max(counts) - min(counts) <= 1  # spread evenly
            late = {0, 1, 2} - {_worker(share) for share in _shares(got[0])}
            assert late
            ray.kill(hog, no_restart=True)  # CPUs come back: Ray places the missing one
            while len({_worker(share) for share in _shares(got[-1])}) < 3:
                got.append(next(batches))
            got += [next(batches) for _ in range(2)]
        assert collector.active_collectors == 3
        assert [_worker(share) for share in _shares(got[-1])] == [0, 1, 2]
        per_worker: dict[int, list] = {}
        for batch in got:
            assert batch.batch_size == (6, T)
            for share in _shares(batch):
                per_worker.setdefault(_worker(share), []).append(share)
        for worker in late:
            assert per_worker[worker][0]["is_init"][:, 0].all()  # new episodes
        for worker, shares in per_worker.items():
            check_batches_contract(shares, lstm, ids_from_zero=False)
            assert (torch.cat(shares, dim=1)["collector", "traj_ids"] % 3 == worker).all()
    finally:
        _release(collector, hog, free)


def _slow_to_build_after(marker: str):
    """CountingEnv, built 15 s late once ``marker`` exists (a replacement that takes long
    to start)."""
    if os.path.exists(marker):
        time.sleep(15)
    return make_env()


def test_sync_does_not_wait_for_a_replacement_to_start(ray_session, tmp_path, fail_after):
    """A remote collector killed mid-run (``sync=True``): its replacement takes 15 s to
    start, and meanwhile the batches keep coming, the other collector collecting both
    shares; then the replacement joins in its own slot with new episodes."""
    from tests._ray_kill import kill_and_wait

    marker = str(tmp_path / "slow")
    lstm, policy = make_policy()
    collector = RayCollector(
        functools.partial(_slow_to_build_after, marker), policy, frames_per_batch=2 * 2 * T,
        num_collectors=2, sync=True, max_restarts=1, update_after_each_batch=True,
    )  # fmt: skip
    try:
        with fail_after(120):
            batches = iter(collector)
            got = [next(batches)]
            open(marker, "w").close()
            kill_and_wait(ray, collector._workers[1].handle, method="info")
            during = []  # the batches yielded while the replacement was starting
            while True:
                got.append(next(batches))
                if collector.restarts == 1 and collector.active_collectors == 2:
                    break
                during.append(got[-1])
            got += [next(batches) for _ in range(2)]
        assert collector.restarts == 1
        assert during, "the batches waited for the replacement's start-up"
        assert [_worker(share) for share in _shares(during[0])] == [0, 0]
        assert [_worker(share) for share in _shares(got[-1])] == [0, 1]
        replacement = [s for b in got[1:] for s in _shares(b) if _worker(s) == 1]
        assert replacement[0]["is_init"][:, 0].all()
        ids = torch.cat(replacement, dim=1)["collector", "traj_ids"]
        assert (ids % 3 == 2).all()  # slot 2 of stride 3 (2 collectors + 1 restart)
        zero = [s for b in got for s in _shares(b) if _worker(s) == 0]
        check_batches_contract(zero, lstm, ids_from_zero=False)
        check_batches_contract(replacement, lstm, ids_from_zero=False)
    finally:
        collector.shutdown()
