"""Tests of recurrl.collectors.RayCollector: batches of remote Collectors, trajectory ids,
hidden state, weights, total_frames, state dicts, seeds, faults, Ray ownership, multi-node
placement and the replay-buffer mode."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.modules import LSTMModule, set_recurrent_mode
from recurrl.testing import CountingEnv

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test classes reach actors

from recurrl.collectors import RayCollector, RemoteCollectorError  # noqa: E402
from recurrl.collectors.ray import SEED_STRIDE  # noqa: E402
from tests._ray_kill import is_dead  # noqa: E402

H = 8
STATE_KEYS = ["rs_h", "rs_c"]
LENGTHS = [3, 5]
make_env = functools.partial(CountingEnv, batch_size=(2,), max_steps=LENGTHS)


def make_policy(bias: tuple[float, float] | None = None, seed: int = 0):
    """LSTM policy; with ``bias`` the action is ``argmax(bias)`` whatever the input."""
    torch.manual_seed(seed)
    lstm = LSTMModule(
        3,
        H,
        in_keys=["observation", *STATE_KEYS],
        out_keys=["features", *(("next", k) for k in STATE_KEYS)],
    )
    head = nn.Linear(H, 2)
    if bias is not None:
        with torch.no_grad():
            head.weight.zero_()
            head.bias.copy_(torch.tensor(bias))
    policy = Seq(
        lstm,
        Mod(head, in_keys=["features"], out_keys=["logits"]),
        Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    )
    return lstm, policy


class BufferedCountingEnv(CountingEnv):
    """CountingEnv whose step counter is a buffer: in env.state_dict(), restored on load."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        count = self.count
        del self.count
        self.register_buffer("count", count)


class FailingEnv(CountingEnv):
    """Raises (``"raise"``) or hangs (``"hang"``) at its ``fail_at``-th step."""

    def __init__(self, fault: str, fail_at: int, **kwargs):
        super().__init__(**kwargs)
        self.fault, self.fail_at, self.steps = fault, fail_at, 0

    def _step(self, tensordict):
        self.steps += 1
        if self.steps == self.fail_at:
            if self.fault == "raise":
                raise ValueError(f"FailingEnv: broken at step {self.steps}")
            time.sleep(600)
        return super()._step(tensordict)


class HangOnceEnv(CountingEnv):
    """Hangs at its first step unless ``flag`` exists (and creates it): only the first
    instance built hangs, a replacement is healthy."""

    def __init__(self, flag: str, **kwargs):
        super().__init__(**kwargs)
        self.flag = flag

    def _step(self, tensordict):
        if not os.path.exists(self.flag):
            open(self.flag, "w").close()
            time.sleep(600)
        return super()._step(tensordict)


class SeededEnv(CountingEnv):
    """Observation = step count + (seed mod 1000) / 1000: shows which seed the env got."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_fraction = 0.0

    def _observation(self):
        return super()._observation() + self.seed_fraction

    def _set_seed(self, seed):
        self.seed_fraction = (seed % 1000) / 1000


@ray.remote(num_cpus=0)
class _StoreActor:
    def __init__(self):
        self.batches = []

    def extend(self, data):
        self.batches.append(data)
        return data.numel()

    def get(self):
        return self.batches


class ActorBuffer:
    """A picklable replay buffer stand-in: ``extend`` writes into a Ray actor."""

    def __init__(self):
        self.actor = _StoreActor.remote()

    def extend(self, data):
        return ray.get(self.actor.extend.remote(data))


def dead(handle, within: float = 30.0) -> bool:
    """Whether the worker actor is dead (``ray.kill`` takes effect asynchronously: poll)."""
    return is_dead(ray, handle, "info", within)


# --- import --------------------------------------------------------------------------------
@pytest.mark.slow  # a subprocess
def test_import_recurrl_does_not_import_ray():
    code = (
        "import sys, recurrl, recurrl.collectors, recurrl.collectors.collector\n"
        "from recurrl.collectors import *\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
        "from recurrl.collectors import RayCollector\n"
        "assert 'ray' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.slow  # a subprocess
def test_without_ray_the_access_names_the_extra():
    code = (
        "import sys\n"
        "sys.modules['ray'] = None  # as if Ray were not installed\n"
        "import recurrl.collectors\n"
        "try:\n"
        "    recurrl.collectors.RayCollector\n"
        "except ImportError as err:\n"
        "    assert 'pip install \"recurrl[ray]\"' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_invalid_arguments_fail_before_ray_starts():
    with pytest.raises(
        ValueError, match=r"not a multiple of num_collectors=3.*frames_per_batch=15"
    ):
        RayCollector(make_env, frames_per_batch=16, num_collectors=3)
    with pytest.raises(ValueError, match=r"may not set \['frames_per_batch'\]"):
        RayCollector(make_env, frames_per_batch=16, collector_kwargs={"frames_per_batch": 8})
    with pytest.raises(ValueError, match="one per remote collector"):
        RayCollector([make_env] * 2, frames_per_batch=16, num_collectors=4)
    with pytest.raises(TypeError, match="callable building an EnvBase"):
        RayCollector(CountingEnv(), frames_per_batch=16)
    with pytest.raises(ValueError, match="list of 2 dicts"):
        RayCollector(make_env, frames_per_batch=16, remote_configs=[{}])


# --- sync ----------------------------------------------------------------------------------
def test_sync_batches_ids_is_init_and_hidden_state(ray_session):
    lstm, policy = make_policy()
    with RayCollector(
        make_env, policy, frames_per_batch=16, total_frames=48, num_collectors=2
    ) as collector:
        assert len(collector) == 3
        batches = list(collector)
        assert collector.frames == 48
        state = collector.state_dict()
    # never requested past total_frames: every remote collector collected exactly 3 batches
    assert [w["collector"]["frames"] for w in state["workers"]] == [24, 24]
    assert [b.batch_size for b in batches] == [torch.Size([4, 4])] * 3
    for data in batches:
        assert data["collector", "worker_id"].tolist() == [[0] * 4, [0] * 4, [1] * 4, [1] * 4]
        assert data["collector", "policy_version"].dtype == torch.int64
        assert (data["collector", "policy_version"] == 0).all()
    data = torch.cat(batches, dim=1)  # [4 env rows, 12 steps]
    is_init = data["is_init"].squeeze(-1)
    lengths = LENGTHS * 2  # worker 0's envs, then worker 1's
    assert is_init.tolist() == [[t % n == 0 for t in range(12)] for n in lengths]
    # env rows kept separate: each row counts its own steps
    obs = data["observation"][..., 0]
    assert obs.tolist() == [[float(t % n) for t in range(12)] for n in lengths]
    # traj ids: a new one exactly at is_init, unique across workers, kept across batches
    ids = data["collector", "traj_ids"]
    assert ((ids[:, 1:] != ids[:, :-1]) == is_init[:, 1:]).all()
    owners = {}
    for row, values in enumerate(ids.tolist()):
        for i in values:
            assert owners.setdefault(i, row) == row
    assert len(owners) == int(is_init.sum())
    assert {i % 2 for i in ids[:2].flatten().tolist()} == {0}  # slot 0, stride 2
    assert {i % 2 for i in ids[2:].flatten().tolist()} == {1}
    # hidden state contract: stepping every row through the policy in sequence from its
    # start gives the stored states (env row 1 has an episode over steps 0..4, across the
    # boundary of batches 0 and 1), and the recurrent replay gives the stored features
    state = {k: torch.zeros_like(data[k][:, 0]) for k in STATE_KEYS}
    for t in range(12):
        start = is_init[:, t].view(-1, 1, 1)
        state = {k: torch.where(start, 0.0, v) for k, v in state.items()}
        for k in STATE_KEYS:
            torch.testing.assert_close(data[k][:, t], state[k], atol=1e-5, rtol=1e-4)
        step = data[:, t].select("observation", "is_init").update(state)
        with torch.no_grad(), set_recurrent_mode(False):
            lstm(step)
        state = {k: step["next", k] for k in STATE_KEYS}
        for k in STATE_KEYS:
            torch.testing.assert_close(data["next", k][:, t], state[k], atol=1e-5, rtol=1e-4)
    assert data["rs_h"][~is_init].abs().sum((-1, -2)).min() > 0
    replay = data.exclude("features", *(("next", k) for k in STATE_KEYS))
    with torch.no_grad(), set_recurrent_mode(True):
        lstm(replay)
    torch.testing.assert_close(replay["features"], data["features"], atol=1e-5, rtol=1e-4)


def test_env_count_not_dividing_the_share_fails_early_with_a_fix(ray_session):
    with pytest.raises(ValueError, match=r"not a multiple of 2.*Fix: frames_per_batch=4"):
        RayCollector(make_env, frames_per_batch=5, num_collectors=1)


def test_env_factory_raising_is_reported_at_construction(ray_session):
    def broken():
        raise OSError("no simulator here")

    with pytest.raises(RemoteCollectorError, match="remote collector 1 could not build") as info:
        RayCollector([make_env, broken], frames_per_batch=8)
    assert info.value.worker_id == 1
    assert "no simulator here" in info.value.remote_traceback


def test_remote_collector_construction_error_is_reported(ray_session):
    with pytest.raises(RemoteCollectorError, match="remote collector 0 could not build its Coll"):
        RayCollector(
            make_env,
            frames_per_batch=8,
            num_collectors=1,
            collector_kwargs={"split_trajs": True},  # the remote Collector rejects it
        )


# --- async ---------------------------------------------------------------------------------
def test_async_batches_per_worker_and_versions(ray_session):
    _, policy = make_policy()
    with RayCollector(
        make_env,
        policy,
        frames_per_batch=8,
        total_frames=48,
        num_collectors=2,
        sync=False,
        collector_kwargs=[{}, {"init_random_frames": 8}],  # per worker
    ) as collector:
        assert len(collector) == 6
        batches = []
        for data in collector:
            batches.append(data)
            if len(batches) == 1:
                collector.update_policy_weights_()
        state = collector.state_dict()
    assert len(batches) == 6
    assert all(b.batch_size == (2, 4) for b in batches)
    workers = [int(b["collector", "worker_id"][0, 0]) for b in batches]
    assert all((b["collector", "worker_id"] == w).all() for b, w in zip(batches, workers))
    assert set(workers) == {0, 1}
    # collector_kwargs reach each worker's Collector: worker 1's first batch is random
    # actions (no policy output), worker 0's is not
    first = {w: next(b for b, x in zip(batches, workers) if x == w) for w in (0, 1)}
    assert "logits" in first[0] and "logits" not in first[1]
    # no request past total_frames: 6 batches of 8 frames collected in all
    assert sum(w["collector"]["frames"] for w in state["workers"]) == 48
    versions = {w: [] for w in (0, 1)}
    for b, w in zip(batches, workers):
        versions[w].append(int(b["collector", "policy_version"][0, 0]))
    for seq in versions.values():
        assert seq == sorted(seq)
    # the update arrived: the batches requested after it carry version 1 (which batch comes
    # last depends on the workers' timing: a slow worker's first batch may arrive after it)
    assert max(max(seq) for seq in versions.values()) == 1
    # each worker's batches continue each other (trajectories go on across its batches)
    for w in (0, 1):
        own = torch.cat([b.select("observation") for b, x in zip(batches, workers) if x == w], 1)
        assert own["observation"][..., 0].tolist() == [
            [float(t % n) for t in range(own.shape[1])] for n in LENGTHS
        ]


# --- weights -------------------------------------------------------------------------------
def test_weight_updates_change_remote_actions(ray_session):
    _, policy = make_policy(bias=(1.0, 0.0))
    head = policy[1].module
    with RayCollector(
        make_env,
        policy,
        frames_per_batch=8,
        total_frames=32,
        num_collectors=2,
        update_after_each_batch=True,
    ) as collector:
        seen = []
        for i, data in enumerate(collector):
            seen.append(
                (
                    data["action"].unique().tolist(),
                    data["collector", "policy_version"].unique().tolist(),
                )
            )
            with torch.no_grad():
                head.bias.copy_(torch.tensor([0.0, 1.0] if i % 2 == 0 else [1.0, 0.0]))
    # pushed after every batch: every remote collector acts with the new weights at once
    assert seen == [([0], [0]), ([1], [1]), ([0], [2]), ([1], [3])]


def test_explicit_update_reaches_every_worker_after_the_prefetched_batch(ray_session, monkeypatch):
    import recurrl.collectors.ray as ray_collector

    _, policy = make_policy(bias=(1.0, 0.0))
    _, other = make_policy(bias=(0.0, 1.0))
    with RayCollector(
        make_env, policy, frames_per_batch=8, total_frames=24, num_collectors=2
    ) as collector:
        it = iter(collector)
        first = next(it)
        put, real_put = [], ray.put
        monkeypatch.setattr(
            ray_collector.ray, "put", lambda value: put.append(value) or real_put(value)
        )
        collector.update_policy_weights_(other.state_dict())
        monkeypatch.undo()
        assert len(put) == 1  # one object for every worker, on CPU and detached
        assert all(not t.requires_grad and t.device.type == "cpu" for t in put[0].values())
        assert collector.policy_version == 1
        second, third = next(it), next(it)
    assert first["action"].unique().tolist() == [0]
    assert second["action"].unique().tolist() == [0]  # requested before the update
    assert (second["collector", "policy_version"] == 0).all()
    assert third["action"].unique().tolist() == [1]  # both workers
    assert (third["collector", "policy_version"] == 1).all()


def test_max_weight_update_interval_pushes_local_weights(ray_session):
    _, policy = make_policy(bias=(1.0, 0.0))
    with RayCollector(
        functools.partial(CountingEnv, max_steps=3),  # unbatched env: batches [1, T]
        policy,
        frames_per_batch=4,
        total_frames=20,
        num_collectors=1,
        max_weight_update_interval=0,
    ) as collector:
        actions = []
        for data in collector:
            actions.append(data["action"].unique().tolist())
            assert data.batch_size == (1, 4)
            with torch.no_grad():
                policy[1].module.bias.copy_(torch.tensor([0.0, 1.0]))  # no explicit update
    assert actions[0] == [0] and actions[-1] == [1]
    assert collector.policy_version >= 1


# --- state dict and seeds --------------------------------------------------------------------
def test_state_dict_round_trip_through_weights_only_load(ray_session, tmp_path):
    env_fn = functools.partial(BufferedCountingEnv, batch_size=(2,), max_steps=LENGTHS)

    def make(seed):
        _, policy = make_policy(seed=seed)
        return RayCollector(env_fn, policy, frames_per_batch=8, total_frames=32, num_collectors=2)

    with make(0) as reference:
        it = iter(reference)
        next(it)
        reference.update_policy_weights_()
        state = reference.state_dict()  # holds the prefetched batch 2
        expected = list(it)
    torch.save(state, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert loaded["policy_version"] == 1 and loaded["frames"] == 8
    with make(seed=1) as resumed:  # other weights: they come from the state dict
        resumed.load_state_dict(loaded)
        assert resumed.frames == 8 and resumed.policy_version == 1
        got = list(resumed)
        assert resumed.frames == 32
    assert len(got) == len(expected) == 3
    for a, b in zip(got, expected, strict=True):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in b.keys(True, True):
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_a_state_saved_between_batches_pushes_the_owed_weights_first(ray_session):
    """update_after_each_batch: a state saved after a batch was yielded, before the next one
    was asked for, still owes the push of the weights learned from it; after loading, the
    next batch is collected with them, as it would have been without the interruption."""
    _, policy = make_policy(bias=(1.0, 0.0))  # action 0
    kwargs = dict(frames_per_batch=16, total_frames=48, num_collectors=2, sync=True,
                  update_after_each_batch=True)  # fmt: skip
    with RayCollector(make_env, policy, **kwargs) as collector:
        first = next(iter(collector))
        state = collector.state_dict()
    assert state["push_owed"] and (first["action"] == 0).all()
    with torch.no_grad():  # what the learner learned from `first`: action 1
        policy[1].module.bias.copy_(torch.tensor([0.0, 1.0]))
    with RayCollector(make_env, policy, **kwargs) as collector:
        collector.load_state_dict(state)
        second = next(iter(collector))
    assert (second["collector", "policy_version"] == 1).all()
    assert (second["action"] == 1).all()


def test_load_state_dict_of_another_shape_raises(ray_session):
    with RayCollector(make_env, frames_per_batch=8, total_frames=8, num_collectors=1) as one:
        state = one.state_dict()
        state["num_collectors"] = 2
        with pytest.raises(ValueError, match="saved with num_collectors=2"):
            one.load_state_dict(state)


def test_set_seed_distinct_and_reproducible_per_worker(ray_session):
    env_fn = functools.partial(SeededEnv, batch_size=(2,))
    with RayCollector(
        env_fn,
        frames_per_batch=8,
        total_frames=16,
        max_restarts=1,
        update_after_each_batch=True,  # no prefetch: the kill hits the next request
        placement_timeout=None,  # the replacement collects the lost share itself
    ) as collector:
        assert collector.set_seed(7) == 7
        it = iter(collector)
        first = next(it)["observation"][:, 0, 0]
        ray.kill(collector._workers[0].handle, no_restart=True)
        assert dead(collector._workers[0].handle)  # ray.kill is asynchronous
        replaced = next(it)["observation"][:2, 0, 0]
        assert collector.worker_info[0]["slot"] == 2
    # worker i gets exactly seed + i * SEED_STRIDE (reproducible), distinct across workers
    fractions = [((7 + i * SEED_STRIDE) % 1000) / 1000 for i in (0, 0, 1, 1)]
    torch.testing.assert_close(first, torch.tensor(fractions))
    assert first[0] != first[2]
    # a replacement (slot 2) is seeded from its slot
    fraction = ((7 + 2 * SEED_STRIDE) % 1000) / 1000
    torch.testing.assert_close(replaced, torch.tensor([fraction] * 2))


# --- faults --------------------------------------------------------------------------------
def test_remote_exception_names_the_worker_and_shuts_everything_down(ray_session, fail_after):
    failing = functools.partial(FailingEnv, "raise", 6, batch_size=(2,))
    with fail_after(120):
        collector = RayCollector([make_env, failing], frames_per_batch=8, total_frames=80)
        handles = [w.handle for w in collector._workers]
        with pytest.raises(RemoteCollectorError, match="remote collector 1 raised") as info:
            list(collector)
    assert info.value.worker_id == 1
    assert "FailingEnv: broken at step 6" in info.value.remote_traceback
    assert "FailingEnv: broken at step 6" in str(info.value)
    assert all(dead(h) for h in handles)
    with pytest.raises(RuntimeError, match="after shutdown"):
        iter(collector)
    collector.shutdown()  # idempotent


def test_killed_actor_is_replaced_with_new_ids(ray_session, fail_after, caplog):
    _, policy = make_policy()
    with (
        fail_after(120),
        caplog.at_level(logging.WARNING, logger="recurrl.collectors.ray"),
        RayCollector(
            make_env,
            policy,
            frames_per_batch=16,
            total_frames=64,
            num_collectors=2,
            max_restarts=1,
            update_after_each_batch=True,  # no prefetch: the kill hits the next request
            placement_timeout=None,  # the replacement collects the lost share itself
        ) as collector,
    ):
        batches = []
        for data in collector:
            batches.append(data)
            if len(batches) == 2:
                ray.kill(collector._workers[0].handle, no_restart=True)
                assert dead(collector._workers[0].handle)  # ray.kill is asynchronous
        assert [w["slot"] for w in collector.worker_info] == [2, 1]
    assert len(batches) == 4  # the round was completed with the replacement's batch
    assert "remote collector 0 (slot 0)" in caplog.text and "slot 2" in caplog.text
    before = torch.cat(batches[:2], dim=1)[:2]
    after = torch.cat(batches[2:], dim=1)[:2]
    old_ids = set(before["collector", "traj_ids"].flatten().tolist())
    new_ids = set(after["collector", "traj_ids"].flatten().tolist())
    assert not old_ids & new_ids  # the dropped trajectories are never continued
    assert {i % 3 for i in new_ids} == {2}  # slot 2, stride num_collectors + max_restarts = 3
    assert after["is_init"][:, 0].all()  # new episodes
    assert after["observation"][..., 0].tolist() == [
        [float(t % n) for t in range(8)] for n in LENGTHS
    ]
    # worker 1 went on undisturbed
    rows = torch.cat(batches, dim=1)[2:]
    assert rows["observation"][..., 0].tolist() == [
        [float(t % n) for t in range(16)] for n in LENGTHS
    ]


def test_killed_actor_without_restarts_raises(ray_session, fail_after):
    with fail_after(120):
        collector = RayCollector(make_env, frames_per_batch=8, total_frames=80, num_collectors=1)
        it = iter(collector)
        next(it)
        ray.kill(collector._workers[0].handle, no_restart=True)
        assert dead(collector._workers[0].handle)  # ray.kill is asynchronous
        with pytest.raises(RemoteCollectorError, match=r"remote collector 0 died.*max_restarts"):
            list(it)
    assert all(dead(w.handle) for w in collector._workers)


def test_hanging_env_times_out(ray_session, fail_after):
    hanging = functools.partial(FailingEnv, "hang", 1, batch_size=(2,))
    with fail_after(120):
        collector = RayCollector([hanging], frames_per_batch=8, timeout=2)
        started = time.monotonic()
        with pytest.raises(RemoteCollectorError, match="remote collector 0 did not answer"):
            next(iter(collector))
        assert time.monotonic() - started < 30
    assert dead(collector._workers[0].handle)


def test_hanging_env_is_replaced_when_restarts_are_allowed(ray_session, fail_after, tmp_path):
    hang_once = functools.partial(HangOnceEnv, str(tmp_path / "hung"), batch_size=(2,))
    with (
        fail_after(120),
        RayCollector(
            [hang_once, make_env], frames_per_batch=8, total_frames=16, timeout=2, max_restarts=1,
            placement_timeout=None,  # the replacement collects the lost share itself
        ) as collector,
    ):
        batches = list(collector)
        assert [w["slot"] for w in collector.worker_info] == [2, 1]
    assert len(batches) == 2
    first = batches[0]
    assert first["observation"][:2, :, 0].tolist() == [[0.0, 1.0]] * 2  # fresh episodes
    assert {i % 3 for i in first["collector", "traj_ids"][:2].flatten().tolist()} == {2}


def test_async_hung_worker_is_found_while_another_delivers(ray_session, fail_after, tmp_path):
    hang_once = functools.partial(HangOnceEnv, str(tmp_path / "hung"), batch_size=(2,))
    with (
        fail_after(120),
        RayCollector(
            [hang_once, make_env], frames_per_batch=8, sync=False, timeout=2, max_restarts=1
        ) as collector,
    ):
        workers = []
        for data in collector:  # worker 1 keeps delivering while worker 0 hangs
            workers.append(int(data["collector", "worker_id"][0, 0]))
            if 0 in workers:
                break
            time.sleep(0.05)
        assert collector.worker_info[0]["slot"] == 2  # replaced, then delivered
    assert workers.count(1) > 5


def test_interrupted_iteration_shuts_everything_down(ray_session):
    hanging = functools.partial(FailingEnv, "hang", 1, batch_size=(2,))
    collector = RayCollector([hanging], frames_per_batch=8)
    handles = [w.handle for w in collector._workers]

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 2.0)  # Ctrl-C while waiting for the batch
        with pytest.raises(KeyboardInterrupt):
            next(iter(collector))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert all(dead(h) for h in handles)


# --- replay buffer -----------------------------------------------------------------------------
def test_replay_buffer_mode_yields_summaries(ray_session):
    buffer = ActorBuffer()
    _, policy = make_policy()
    with RayCollector(
        make_env,
        policy,
        frames_per_batch=8,
        total_frames=32,
        sync=False,
        replay_buffer=buffer,
    ) as collector:
        summaries = list(collector)
    stored = ray.get(buffer.actor.get.remote())
    ray.kill(buffer.actor)
    assert len(summaries) == len(stored) == 4
    expected = {
        ("next", "done"),
        ("next", "terminated"),
        ("next", "truncated"),
        ("collector", "policy_version"),
        ("collector", "worker_id"),
    }
    for summary in summaries:
        assert set(summary.keys(True, True)) == expected
        assert summary.batch_size == (2, 4)
    assert sum(b.numel() for b in stored) == 32
    assert "observation" in stored[0] and stored[0].batch_size == (2, 4)
    done = sorted(s["next", "done"].sum().item() for s in summaries)
    assert done == sorted(b["next", "done"].sum().item() for b in stored)


def test_replay_buffer_mode_with_ray_replay_buffer(ray_session):
    from recurrl.data import LazyTensorStorage, RayReplayBuffer

    buffer = RayReplayBuffer(storage=LazyTensorStorage(100), batch_size=4, seed=0)
    try:
        with RayCollector(
            make_env,
            frames_per_batch=8,
            total_frames=24,
            num_collectors=1,
            sync=False,
            replay_buffer=buffer,
        ) as collector:
            summaries = list(collector)
        assert len(summaries) == 3 and "observation" not in summaries[0]
        assert len(buffer) == 24
        assert buffer.sample()["observation"].shape == (4, 3)
    finally:
        buffer.shutdown()


# --- Ray ownership and nodes (own processes: the test session holds Ray) --------------------------
def run_script(code: str, timeout: float) -> str:
    """Run ``code`` in a new python with a Ray temporary folder of its own.

    Ray records the address of the last cluster started by ``ray start`` or by
    ``ray.cluster_utils.Cluster`` in ``<temp>/ray/ray_current_cluster``, and a
    ``ray.init()`` without an address joins it: a folder of its own keeps the script from
    joining, or advertising, any other cluster on the machine (another test worker's, a
    stale one). A short path: Ray's socket paths must fit in 107 characters.
    """
    import shutil
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="recurrl-ray-")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = ray_tmp
    try:
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.xdist_group("ray")  # with the other Ray tests: one Ray at a time on 2 cores
@pytest.mark.slow  # starts Ray twice in a subprocess
def test_ray_started_by_the_collector_is_shut_down_and_other_ray_left_running():
    out = run_script(
        """
        import functools, ray
        from recurrl.collectors import RayCollector
        from recurrl.testing import CountingEnv
        make = functools.partial(CountingEnv, batch_size=(2,))
        c = RayCollector(make, frames_per_batch=4, total_frames=8, num_collectors=1,
                         ray_init_config={"num_cpus": 1, "log_to_driver": False})
        assert ray.is_initialized()
        assert len(list(c)) == 2
        c.shutdown()
        assert not ray.is_initialized(), "Ray started by the collector still running"
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
        with RayCollector(make, frames_per_batch=4, total_frames=8, num_collectors=1) as c:
            assert len(list(c)) == 2
        assert ray.is_initialized(), "a Ray the collector did not start was shut down"
        ray.shutdown()
        print("ok")
        """,
        timeout=240,
    )
    assert out.strip().endswith("ok")


@pytest.mark.xdist_group("ray")
@pytest.mark.slow  # a three-node Ray cluster in a subprocess
def test_multi_node_cluster_pins_one_collector_per_node():
    out = run_script(
        """
        import functools, ray
        try:
            from ray.cluster_utils import Cluster
        except ImportError:
            print("skip"); raise SystemExit(0)
        from recurrl.collectors import RayCollector
        from recurrl.testing import CountingEnv
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        a = cluster.add_node(num_cpus=1, resources={"node_a": 1})
        b = cluster.add_node(num_cpus=1, resources={"node_b": 1})
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            with RayCollector(
                functools.partial(CountingEnv, batch_size=(2,)), frames_per_batch=8,
                total_frames=16,
                remote_configs=[{"resources": {"node_a": 1}}, {"resources": {"node_b": 1}}],
            ) as c:
                nodes = [w["node_id"] for w in c.worker_info]
                assert nodes == [a.node_id, b.node_id], (nodes, a.node_id, b.node_id)
                assert [d.batch_size for d in c] == [(4, 2), (4, 2)]
        finally:
            ray.shutdown()
            cluster.shutdown()
        print("ok")
        """,
        timeout=300,
    )
    if out.strip().endswith("skip"):
        pytest.skip("ray.cluster_utils.Cluster is not available")
    assert out.strip().endswith("ok")
