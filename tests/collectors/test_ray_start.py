"""Start-up of a RayCollector's remote collectors (recurrl.collectors._ray_start): with
``sync=False`` fewer remote collectors than asked collect when the cluster cannot place them
all, and the missing ones join, with their own trajectory ids, once Ray starts them."""

from __future__ import annotations

import functools
import time

import pytest
import torch

from recurrl.testing import CountingEnv
from tests.collectors._contract import check_batches_contract
from tests.collectors.test_ray import make_policy

ray = pytest.importorskip("ray")

from recurrl.collectors import RayCollector  # noqa: E402

T = 8
make_env = functools.partial(CountingEnv, batch_size=(2,), max_steps=[3, 5])


class _Hog:
    """An actor that only holds the CPUs it was created with."""

    def ready(self) -> bool:
        return True


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
    free = int(ray.available_resources().get("CPU", 0))
    if free < 3:
        pytest.skip(f"needs 3 free CPUs in the test cluster, has {free}")
    hog = ray.remote(_Hog).options(num_cpus=free - 2).remote()
    ray.get(hog.ready.remote(), timeout=60)
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
            late = 3 - collector.active_collectors
            assert f"{late} of 3 remote collectors (" in lines[0] and "2)" in lines[0]
            assert "did not start within placement_timeout=20 s" in lines[0]
            assert "'num_cpus': 1" in lines[0] and "Collecting with the " in lines[0]
            batches = iter(collector)
            got = [next(batches) for _ in range(2)]
            while len({int(b["collector", "worker_id"][0, 0]) for b in got}) < 2:
                got.append(next(batches))  # first come, first served: until both delivered
            assert {int(b["collector", "worker_id"][0, 0]) for b in got} == {0, 1}
            assert collector.active_collectors == 2
            saved = collector.state_dict()  # the one not started has no collector state yet
            assert [w["collector"] is None for w in saved["workers"]] == [False, False, True]
            ray.kill(hog, no_restart=True)  # CPUs come back: Ray places the third
            while True:
                got.append(next(batches))
                if int(got[-1]["collector", "worker_id"][0, 0]) == 2:
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
        first = per_worker[2][0]
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
        if collector is not None:
            collector.shutdown()
        ray.kill(hog, no_restart=True)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < free and time.monotonic() < deadline:
        time.sleep(0.2)  # the next tests find the cluster as it was


def test_sync_needs_every_worker_and_says_what_cannot_be_placed(ray_session, monkeypatch):
    """``sync=True``: every batch holds every remote collector's share, so one that Ray
    cannot place (it asks for 100 CPUs) ends the start-up with an error naming what it asks
    for and the fix, after the start timeout (shortened here), not a wait forever."""
    from recurrl.collectors import RemoteCollectorError, _ray_start

    monkeypatch.setattr(_ray_start, "MIN_START_TIMEOUT", 2.0)
    with pytest.raises(RemoteCollectorError, match="did not start within 2 s") as info:
        RayCollector(make_env, frames_per_batch=2 * T, num_collectors=2, timeout=2,
                     remote_configs=[{"num_cpus": 1}, {"num_cpus": 100}])  # fmt: skip
    text = str(info.value)
    assert "{'num_cpus': 100}" in text  # (the other may be late too on a loaded machine)
    assert "or sync=False (it goes on with the remote collectors that start)" in text
