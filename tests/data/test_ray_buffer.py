"""RayReplayBuffer: a TensorDictReplayBuffer in a Ray actor behaves as the local one."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    RandomSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from tests._ray_kill import kill_and_wait
from tests.data._fake import FakeCollector

pytest.importorskip("ray")

SEED = 7


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a new python; a Ray it starts keeps its session files (logs, sockets)
    in a temporary folder of its own (a short path: socket paths must fit in 107
    characters), removed afterwards, and cannot see another cluster's address file."""
    import shutil
    import tempfile

    ray_tmp = tempfile.mkdtemp(prefix="recurrl-ray-")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = ray_tmp
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True, text=True, timeout=timeout, env=env,
        )  # fmt: skip
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _batches(num: int = 3, envs: int = 3, steps: int = 12) -> list[TensorDictBase]:
    """``[N, T]`` batches of several trajectories per env (mid-row resets)."""
    fake = FakeCollector(envs, 2, 7, seed=1)
    return [fake.batch(steps) for _ in range(num)]


def _equal(a: TensorDictBase, b: TensorDictBase) -> bool:
    keys = set(a.keys(True, True))
    return keys == set(b.keys(True, True)) and all(torch.equal(a[k], b[k]) for k in keys)


def _pair(make_sampler, storage=None, max_size: int = 80, batch_size: int = 16):
    """A local and a remote buffer fed the same batches; the local one seeded like the
    remote one (samplers draw from torch's global generator)."""
    from recurrl.data import RayReplayBuffer

    storage = storage if storage is not None else LazyTensorStorage(max_size)
    remote = RayReplayBuffer(storage=storage, sampler=make_sampler(), batch_size=batch_size,
                             seed=SEED)  # fmt: skip
    local = TensorDictReplayBuffer(storage=LazyTensorStorage(max_size), sampler=make_sampler(),
                                   batch_size=batch_size)  # fmt: skip
    torch.manual_seed(SEED)
    return local, remote


# -- import ---------------------------------------------------------------------------
@pytest.mark.slow  # a subprocess
def test_importing_recurrl_does_not_import_ray():
    done = _run("""
        import sys
        import recurrl, recurrl.data
        from recurrl.data import *  # noqa: F403
        assert "ray" not in sys.modules, "ray was imported"
        print("ok")
    """)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


@pytest.mark.slow  # a subprocess
def test_without_ray_the_import_error_says_what_to_install():
    done = _run("""
        import sys
        sys.modules["ray"] = None  # as if not installed
        try:
            from recurrl.data import RayReplayBuffer
        except ImportError as err:
            print(err)
    """)
    assert done.returncode == 0, done.stderr
    assert 'pip install "recurrl[ray]"' in done.stdout


# -- same answers as the local buffer ---------------------------------------------------
def test_slice_sampling_matches_the_local_buffer_and_stays_in_trajectories(ray_session):
    local, remote = _pair(lambda: SliceSampler(slice_len=4))
    try:
        for batch in _batches():  # 108 steps into 80: the ring wraps
            assert torch.equal(remote.extend(batch), local.extend(batch))
        assert len(remote) == len(local) == 80
        for _ in range(3):
            got, want = remote.sample(), local.sample()
            assert _equal(got, want)
            tid, t = got["tid"].view(4, 4), got["t"].view(4, 4)
            assert (tid == tid[:, :1]).all()  # a slice never crosses a trajectory
            assert (t[:, 1:] == t[:, :-1] + 1).all()  # ... and is contiguous in time
            assert got["is_init"].view(4, 4)[:, 0].all()
        got, info = remote.sample(8, return_info=True)
        want, want_info = local.sample(8, return_info=True)
        assert _equal(got, want) and set(info) == set(want_info)
        assert all(torch.equal(info[k], want_info[k]) for k in info)
        assert torch.equal(info["index"], got["index"])
    finally:
        remote.shutdown()


def test_random_sampling_and_add_match_the_local_buffer(ray_session):
    local, remote = _pair(RandomSampler)
    try:
        batch = _batches(1)[0]
        assert torch.equal(remote.extend(batch), local.extend(batch))
        step = batch[1, 3]
        assert remote.add(step) == local.add(step) == 36
        assert len(remote) == len(local) == 37
        assert _equal(remote.sample(), local.sample())
        assert _equal(remote.sample(5), local.sample(5))
        remote.set_seed(3)
        torch.manual_seed(3)
        assert _equal(remote.sample(), local.sample())
    finally:
        remote.shutdown()


def test_priority_updates_reach_the_actors_sampler_as_locally(ray_session):
    from recurrl.data import PrioritizedSliceSampler

    def make():
        return PrioritizedSliceSampler(max_capacity=80, alpha=1.0, beta=1.0, slice_len=4)

    local, remote = _pair(make)
    try:
        for batch in _batches(2):
            remote.extend(batch), local.extend(batch)
        got, want = remote.sample(), local.sample()
        assert _equal(got, want)
        starts = got["index"].view(4, 4)[:, 0]
        value = torch.tensor([5.0, 1.0, 2.0, 0.5], requires_grad=True)  # detached on the way
        remote.update_priority(starts, value), local.update_priority(starts, value)
        got, want = remote.sample(), local.sample()
        assert _equal(got, want) and not torch.equal(got["_weight"], torch.ones(16))
        td_error = torch.rand(16, generator=torch.Generator().manual_seed(0))  # per step, flat
        got["td_error"], want["td_error"] = td_error, td_error
        remote.update_tensordict_priority(got), local.update_tensordict_priority(want)
        remote_priority = remote.state_dict()["sampler"]["priority"]
        assert torch.equal(remote_priority, local.state_dict()["sampler"]["priority"])
        assert _equal(remote.sample(), local.sample())
    finally:
        remote.shutdown()
    uniform = _pair(lambda: SliceSampler(slice_len=4), max_size=40)[1]
    try:
        uniform.extend(_batches(1)[0][:, :8])
        with pytest.raises(TypeError, match="keeps no priorities"):
            uniform.update_priority(torch.tensor([0]), 1.0)
    finally:
        uniform.shutdown()


def test_iteration_stops_with_the_epoch_as_locally(ray_session):
    local, remote = _pair(lambda: SliceSamplerWithoutReplacement(slice_len=4))
    try:
        for batch in _batches(1):
            remote.extend(batch)
            local.extend(batch)
        got, want = list(remote), list(local)
        assert len(got) == len(want) > 1
        assert all(_equal(a, b) for a, b in zip(got, want, strict=True))
    finally:
        remote.shutdown()


# -- handles ----------------------------------------------------------------------------
def test_a_ray_task_writes_and_samples_through_a_pickled_handle(ray_session):
    from recurrl.data import RayReplayBuffer

    ray = ray_session

    def mark(td):  # runs where sample() is called
        return td.set("sampled_in", torch.full(td.batch_size, os.getpid()))

    rb = RayReplayBuffer(storage=LazyTensorStorage(100), batch_size=4, transform=mark)

    @ray.remote(num_cpus=0)
    def writer(buffer, data):
        index = buffer.extend(data)
        pid = int(buffer.sample()["sampled_in"][0])
        return index, len(buffer), pid, os.getpid(), buffer.is_owner

    try:
        batch = _batches(1)[0]
        index, length, pid, task_pid, owner = ray.get(writer.remote(rb, batch), timeout=120)
        assert torch.equal(index, torch.arange(36)) and length == 36 == len(rb)
        assert rb.write_count == 36  # every handle's writes, read from the actor
        assert pid == task_pid != os.getpid() and not owner  # transform on the caller side
        assert int(rb.sample()["sampled_in"][0]) == os.getpid()
    finally:
        rb.shutdown()


def test_a_handles_shutdown_leaves_the_actor_and_the_owners_kills_it(ray_session, fail_after):
    from recurrl.data import RayReplayBuffer

    rb = RayReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, timeout=60)
    rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
    handle, other = pickle.loads(pickle.dumps(rb)), pickle.loads(pickle.dumps(rb))
    assert rb.is_owner and not handle.is_owner and "handle" in repr(handle)
    handle.shutdown()
    assert len(rb) == len(other) == 4  # the actor lives on
    with pytest.raises(RuntimeError, match="shut down"):
        len(handle)
    rb.shutdown()
    rb.shutdown()  # twice is harmless
    with pytest.raises(RuntimeError, match="shut down"):
        rb.sample()
    with fail_after(60), pytest.raises(RuntimeError, match=r"RayReplayBuffer\(actor .*dead"):
        for _ in range(100):  # the kill is asynchronous: the actor is dead within moments
            len(other)
            time.sleep(0.1)


def test_a_call_between_the_owners_close_and_the_kill_says_the_actor_is_dead(ray_session):
    """shutdown() closes the actor, then kills it; the kill lands a moment later. A handle's
    call in that window is the documented dead-actor error, not a failure on the dropped
    buffer (here the window is held open: close without the kill)."""
    import ray

    from recurrl.data import RayReplayBuffer

    rb = RayReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, timeout=60)
    rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
    other = pickle.loads(pickle.dumps(rb))
    ray.get(rb._actor.close.remote())
    with pytest.raises(RuntimeError, match=r"RayReplayBuffer\(actor .*dead.*shut it down"):
        len(other)
    with pytest.raises(RuntimeError, match="dead"):
        other.sample()
    rb.shutdown()


def test_unreferenced_owner_kills_its_actor(ray_session, fail_after):
    import gc

    from recurrl.data import RayReplayBuffer

    rb = RayReplayBuffer(storage=LazyTensorStorage(10), timeout=60)
    handle = pickle.loads(pickle.dumps(rb))
    del rb
    gc.collect()
    with fail_after(60), pytest.raises(RuntimeError, match="dead"):
        for _ in range(100):
            len(handle)
            time.sleep(0.1)


# -- errors ---------------------------------------------------------------------------
def test_remote_errors_keep_their_type_and_carry_the_remote_traceback(ray_session, tmp_path):
    from ray.exceptions import RayError

    from recurrl.data import RayReplayBuffer

    rb = RayReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=2))
    try:
        with pytest.raises(RuntimeError, match="the storage is empty") as empty:
            rb.sample(4)
        rb.extend(TensorDict({"x": torch.arange(4), ("collector", "traj_ids"):
                              torch.zeros(4, dtype=torch.int64)}, [4]))  # fmt: skip
        with pytest.raises(ValueError, match="does not match the stored layout") as layout:
            rb.extend(TensorDict({"y": torch.zeros(3)}, [3]))
        with pytest.raises(ValueError, match="expected a batch_size"):
            rb.sample()
        with pytest.raises(ValueError, match="positive multiple of slice_len"):
            rb.sample(3)
        with pytest.raises(FileNotFoundError, match="expected a directory written by dumps"):
            rb.loads(tmp_path / "nothing")
        no_ids = RayReplayBuffer(storage=LazyTensorStorage(4), timeout=60,
                                 sampler=SliceSampler(slice_len=2, traj_key="tid"))  # fmt: skip
        # printed as text (real newlines), not as the repr of a message
        with pytest.raises(KeyError, match=r"trajectory id key 'tid'.*\)\.\n\n\[RayRep") as key:
            no_ids.extend(TensorDict({"x": torch.arange(2)}, [2]))
        no_ids.shutdown()
        for err in (empty.value, layout.value, key.value):
            assert not isinstance(err, RayError)
            assert "remote traceback" in str(err) and "replay_buffers.py" in str(err)
        assert len(rb) == 4  # an error leaves the buffer usable
    finally:
        rb.shutdown()


def test_construction_errors_are_raised_before_any_actor(ray_session):
    from recurrl.data import RayReplayBuffer

    with pytest.raises(TypeError, match="expected storage to be a recurrl"):
        RayReplayBuffer()
    with pytest.raises(ValueError, match="positive multiple of slice_len"):
        RayReplayBuffer(storage=LazyTensorStorage(8), sampler=SliceSampler(slice_len=4),
                        batch_size=6)  # fmt: skip
    with pytest.raises(ValueError, match="timeout"):
        RayReplayBuffer(storage=LazyTensorStorage(8), timeout=0)


def test_a_slow_call_times_out_instead_of_hanging(ray_session, fail_after):
    from recurrl.data import RayReplayBuffer

    def slow(td):  # collate_fn runs in the actor
        time.sleep(3)
        return td

    rb = RayReplayBuffer(storage=LazyTensorStorage(8), batch_size=2, collate_fn=slow)
    try:
        rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
        rb.timeout = 0.5
        with fail_after(30), pytest.raises(TimeoutError, match=r"timeout=0\.5"):
            rb.sample()
    finally:
        rb.shutdown()


# -- persistence ------------------------------------------------------------------------
def _plain_only(obj) -> bool:
    if isinstance(obj, dict):
        return all(_plain_only(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_plain_only(v) for v in obj)
    return obj is None or type(obj) in (torch.Tensor, int, float, bool, str)


def test_state_dict_round_trips_through_a_weights_only_file(ray_session, tmp_path):
    from recurrl.data import RayReplayBuffer

    def make():
        return RayReplayBuffer(storage=LazyTensorStorage(50), sampler=SliceSampler(slice_len=3),
                               batch_size=9, seed=0)  # fmt: skip

    rb, restored = make(), make()
    try:
        for batch in _batches(2):  # 72 steps into 50: wrapped, with sampler bookkeeping
            rb.extend(batch)
        state = rb.state_dict()
        assert _plain_only(state)
        torch.save(state, tmp_path / "buffer.pt")
        restored.load_state_dict(torch.load(tmp_path / "buffer.pt", weights_only=True))
        assert len(restored) == len(rb) == 50
        rb.set_seed(5)
        restored.set_seed(5)
        assert _equal(restored.sample(), rb.sample())
        more = _batches(3)[2]
        assert torch.equal(restored.extend(more), rb.extend(more))  # writer state too
        assert _equal(restored.sample(), rb.sample())
    finally:
        rb.shutdown()
        restored.shutdown()


def test_dumps_and_loads_run_in_the_actor(ray_session, tmp_path):
    from recurrl.data import RayReplayBuffer

    rb = RayReplayBuffer(storage=LazyTensorStorage(40), sampler=SliceSampler(slice_len=2),
                         batch_size=4, seed=0)  # fmt: skip
    try:
        for batch in _batches(2):
            rb.extend(batch)
        rb.dumps(tmp_path / "rb")  # same node here: the files are visible to the test
        assert (tmp_path / "rb" / "buffer_state.pt").exists()
        # a local buffer reads what the actor wrote, and the actor reads it back
        local = TensorDictReplayBuffer(storage=LazyTensorStorage(40),
                                       sampler=SliceSampler(slice_len=2), batch_size=4)  # fmt: skip
        local.loads(tmp_path / "rb")
        rb.extend(_batches(3)[2])  # changes the actor's buffer ...
        rb.loads(tmp_path / "rb")  # ... which loads() undoes
        assert len(rb) == len(local) == 40
        rb.set_seed(1)
        torch.manual_seed(1)
        assert _equal(rb.sample(), local.sample())
    finally:
        rb.shutdown()


# -- storages ---------------------------------------------------------------------------
def test_a_memmap_storage_gets_its_own_files_in_the_actor(ray_session, tmp_path):
    storage = LazyMemmapStorage(30, scratch_dir=tmp_path / "disk")
    local, remote = _pair(lambda: SliceSampler(slice_len=3), storage, 30, 6)
    try:
        for batch in _batches(1):
            assert torch.equal(remote.extend(batch), local.extend(batch))
        assert not storage.initialized  # the caller's storage object was copied, untouched
        actor_dirs = [p for p in (tmp_path / "disk").iterdir() if p.is_dir()]
        assert len(actor_dirs) == 1 and list(actor_dirs[0].rglob("*.memmap"))
        assert _equal(remote.sample(), local.sample())
    finally:
        remote.shutdown()
    assert not actor_dirs[0].exists()  # shut down cleanly: its scratch files are removed


@pytest.mark.xdist_group("ray")  # starts a Ray of its own: not beside the shared one
@pytest.mark.slow  # starts Ray in a subprocess
def test_the_buffer_starts_ray_when_needed_and_its_owner_stops_it():
    done = _run("""
        import ray, torch
        from tensordict import TensorDict
        from recurrl.data import LazyTensorStorage, RayReplayBuffer
        rb = RayReplayBuffer(storage=LazyTensorStorage(8), batch_size=2, ray_init_config=dict(
            num_cpus=1, log_to_driver=False, configure_logging=False))
        assert ray.is_initialized()
        rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
        assert len(rb) == 3
        rb.shutdown()
        assert not ray.is_initialized()
        print("ok")
    """, timeout=180)  # fmt: skip
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_ray_is_started_locally_unless_an_address_is_given(monkeypatch):
    from recurrl.data.ray_buffer import _init_kwargs

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _init_kwargs(None) == {"include_dashboard": False, "address": "local"}
    assert _init_kwargs({"address": "auto"})["address"] == "auto"
    assert _init_kwargs({"num_cpus": 2, "include_dashboard": True}) == {
        "include_dashboard": True, "num_cpus": 2, "address": "local"}  # fmt: skip
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert "address" not in _init_kwargs(None)  # Ray reads RAY_ADDRESS itself


def test_a_sampler_generator_reaches_the_actor_as_built_without_a_seed(ray_session):
    """``seed=None`` seeds only the actor's global stream: a sampler's own generator keeps
    its state, so the remote draws equal a local buffer's with the same generator."""
    from recurrl.data import RayReplayBuffer

    def make(buffer_cls, **extra):
        return buffer_cls(storage=LazyTensorStorage(64), batch_size=8,
                          sampler=RandomSampler(generator=torch.Generator().manual_seed(5)),
                          **extra)  # fmt: skip

    data = TensorDict({"x": torch.arange(64)}, [64])
    local = make(TensorDictReplayBuffer)
    local.extend(data)
    remote = make(RayReplayBuffer, ray_init_config={"num_cpus": 1})
    try:
        state = remote.state_dict()["sampler"]["generator"]
        assert torch.equal(state, torch.Generator().manual_seed(5).get_state())
        remote.extend(data)
        assert torch.equal(remote.sample()["x"], local.sample()["x"])
    finally:
        remote.shutdown()


# -- a dead actor is rebuilt ------------------------------------------------------------
def _kill(ray, buffer) -> None:
    """Kill the buffer's actor by its handle and wait until Ray reports it dead."""
    kill_and_wait(ray, buffer._actor)


def test_the_owner_rebuilds_a_dead_actor_from_the_restored_state(ray_session, caplog):
    """The owner's next call after the kill builds a new actor, loads what ``restore()``
    returns (4 steps saved; the 3 written after are lost), logs one line and answers; a
    handle made before the kill finds the new actor; the budget ends with a clear error."""
    from recurrl.data import RayReplayBuffer
    from recurrl.data.ray_buffer import BufferActorDiedError

    saved: dict = {}
    rb = RayReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, timeout=60, seed=SEED,
                         max_restarts=1, restore=lambda: saved.get("state"))  # fmt: skip
    try:
        rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
        saved["state"] = rb.state_dict()
        rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
        handle = pickle.loads(pickle.dumps(rb))
        old = repr(rb)
        _kill(ray_session, rb)
        with caplog.at_level("WARNING", logger="recurrl.data.ray_buffer"):
            assert len(rb) == 4 and rb.restarts == 1
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "\n" not in lines[0], lines
        assert "rebuilt as" in lines[0] and "(restart 1 of 1)" in lines[0]
        assert "refilled with 4 steps" in lines[0] and "written since is lost" in lines[0]
        assert repr(rb) != old and len(rb.faults) == 1 and "killed" in rb.faults[0]
        assert torch.equal(handle.extend(TensorDict({"x": torch.arange(2)}, [2])),
                           torch.tensor([4, 5]))  # fmt: skip
        assert len(rb) == 6 and handle.restarts == 0  # the handle moved, it rebuilt nothing
        _kill(ray_session, rb)
        with pytest.raises(BufferActorDiedError, match=r"no restart left \(max_restarts=1"):
            rb.sample()
    finally:
        rb.shutdown()


def test_a_handle_never_rebuilds_and_an_owner_without_restore_starts_empty(ray_session, caplog):
    from recurrl.data import RayReplayBuffer
    from recurrl.data.ray_buffer import BufferActorDiedError

    rb = RayReplayBuffer(storage=LazyTensorStorage(10), timeout=60, max_restarts=2)
    try:
        rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
        handle = pickle.loads(pickle.dumps(rb))
        _kill(ray_session, rb)
        with pytest.raises(BufferActorDiedError, match="owner has not rebuilt it"):
            handle.extend(TensorDict({"x": torch.arange(2)}, [2]))
        assert rb.restarts == 0  # nothing was rebuilt by the handle
        with caplog.at_level("WARNING", logger="recurrl.data.ray_buffer"):
            assert len(rb) == 0 and rb.restarts == 1
        assert "it starts empty (no restore() was given)" in caplog.records[-1].getMessage()
        handle.extend(TensorDict({"x": torch.arange(2)}, [2]))
        assert len(rb) == 2
    finally:
        rb.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        len(rb)


def test_rebuild_options_are_checked(ray_session):
    from recurrl.data import RayReplayBuffer

    with pytest.raises(ValueError, match="max_restarts to be an int >= 0"):
        RayReplayBuffer(storage=LazyTensorStorage(10), max_restarts=-1)
    with pytest.raises(TypeError, match="restore to be a callable"):
        RayReplayBuffer(storage=LazyTensorStorage(10), restore={"storage": None})


def test_saved_contents_that_do_not_load_leave_the_rebuilt_buffer_empty(ray_session, caplog):
    """A ``restore()`` whose state does not fit, or that raises, does not end the run: the
    rebuilt buffer starts empty and the log line says why."""
    from recurrl.data import RayReplayBuffer

    answers = iter([{"storage": "not a state"}, ZeroDivisionError("no save here")])

    def restore():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    rb = RayReplayBuffer(storage=LazyTensorStorage(10), timeout=60, max_restarts=2,
                         restore=restore)  # fmt: skip
    try:
        rb.extend(TensorDict({"x": torch.arange(4)}, [4]))
        with caplog.at_level("WARNING", logger="recurrl.data.ray_buffer"):
            _kill(ray_session, rb)
            assert len(rb) == 0
            _kill(ray_session, rb)
            assert len(rb) == 0 and rb.restarts == 2
        first, second = (r.getMessage() for r in caplog.records)
        assert "it starts empty (the saved contents did not load: " in first
        assert "it starts empty (restore() failed: ZeroDivisionError: no save here)" in second
        rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
        assert len(rb) == 3
    finally:
        rb.shutdown()
