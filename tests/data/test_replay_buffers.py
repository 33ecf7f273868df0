"""ReplayBuffer / TensorDictReplayBuffer: extend, add, sample, persistence, errors."""

from __future__ import annotations

import random

import pytest
import torch
from tensordict import TensorDict

from recurrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from recurrl.data.replay_buffers import _fused_marks
from tests.data._fake import TRAJ, FakeCollector

SAMPLERS = {"with_replacement": SliceSampler, "without_replacement": SliceSamplerWithoutReplacement}

STORAGES = {"tensor": LazyTensorStorage, "memmap": LazyMemmapStorage}


def test_multi_env_data_is_written_row_by_row():
    rb = ReplayBuffer(storage=LazyTensorStorage(20))
    data = TensorDict({"x": torch.arange(6).view(2, 3)}, [2, 3])
    assert rb.extend(data).tolist() == [0, 1, 2, 3, 4, 5]
    assert rb.storage.data["x"][:6].tolist() == [0, 1, 2, 3, 4, 5]  # env 0, then env 1
    assert len(rb) == 6


def test_leading_dims_are_flattened():
    rb = ReplayBuffer(storage=LazyTensorStorage(30))
    rb.extend(TensorDict({"x": torch.arange(24).view(2, 3, 4)}, [2, 3, 4]))
    assert rb.storage.data["x"][:24].tolist() == list(range(24))


def test_add_and_sample_defaults():
    rb = ReplayBuffer(storage=LazyTensorStorage(5), batch_size=3)
    assert rb.add(TensorDict({"x": torch.tensor(7)}, [])) == 0
    sample = rb.sample()
    assert isinstance(rb.sampler, RandomSampler) and sample["x"].tolist() == [7, 7, 7]
    assert "index" not in sample
    data, info = rb.sample(2, return_info=True)
    assert info["index"].tolist() == [0, 0] and data.batch_size == (2,)


def test_tensordict_buffer_writes_index():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    rb.extend(TensorDict({"x": torch.arange(10) * 2}, [10]))
    sample = rb.sample()
    assert torch.equal(sample["x"], sample["index"] * 2)


def test_larger_than_capacity_extend_keeps_newest_and_cuts_trajectory():
    sampler = SliceSampler(slice_len=2)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=sampler, batch_size=4)
    rb.extend(FakeCollector(None, 100, 100, 0).batch(13))
    assert rb.storage.data["t"].tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    assert sampler._segments.starts.tolist() == [0] and sampler._segments.lengths.tolist() == [8]
    new = FakeCollector(None, 100, 100, 0).batch(3)
    new[TRAJ] += 1000  # a new trajectory
    rb.extend(new)
    segments = sampler._segments
    assert segments.starts.tolist() == [3, 0] and segments.lengths.tolist() == [5, 3]


def test_collate_fn_and_transform_are_applied_in_order():
    calls = []

    def collate(td):
        calls.append("collate")
        return td

    def transform(td):
        calls.append("transform")
        return td.set("y", td["x"] + 1)

    rb = ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2, collate_fn=collate,
                      transform=transform)  # fmt: skip
    rb.extend(TensorDict({"x": torch.zeros(4)}, [4]))
    assert rb.sample()["y"].tolist() == [1.0, 1.0] and calls == ["collate", "transform"]


def test_iteration_stops_at_the_end_of_an_epoch():
    sampler = SliceSamplerWithoutReplacement(slice_len=5)
    rb = ReplayBuffer(storage=LazyTensorStorage(40), sampler=sampler, batch_size=10)
    rb.extend(FakeCollector(None, 20, 20, 0).batch(40))
    assert sum(s["is_init"].sum().item() for s in rb) == 2 * 16


@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("sampler", ["random", "slice", "slice_wo"])
def test_dumps_loads_is_bit_identical(tmp_path, storage, sampler):
    def make():
        samplers = {
            "random": RandomSampler(generator=torch.Generator().manual_seed(0)),
            "slice": SliceSampler(slice_len=4, generator=torch.Generator().manual_seed(0)),
            "slice_wo": SliceSamplerWithoutReplacement(
                num_slices=3, strict_length=False, generator=torch.Generator().manual_seed(0)
            ),
        }
        return TensorDictReplayBuffer(storage=STORAGES[storage](50), sampler=samplers[sampler],
                                      batch_size=12)  # fmt: skip

    rb = make()
    collector = FakeCollector(3, 2, 9, 0)
    for _ in range(4):
        rb.extend(collector.batch(7))  # wraps
    rb.sample()
    rb.dumps(tmp_path / "rb")
    other = make()
    other.loads(tmp_path / "rb")
    assert (other.storage.data == rb.storage.data).all()
    assert _flat(other.state_dict()) == _flat(rb.state_dict())
    for _ in range(3):  # the same future: samples, and samples after further writes
        a, b = rb.sample(), other.sample()
        assert (a == b).all()
        data = collector.batch(5)
        rb.extend(data)
        other.extend(data)


def _flat(state) -> list:
    """A comparable rendering of a nested state dict (tensors as lists)."""
    if isinstance(state, dict):
        return [(k, _flat(v)) for k, v in sorted(state.items(), key=lambda kv: str(kv[0]))]
    if isinstance(state, TensorDict):
        return _flat(state.to_dict())
    if torch.is_tensor(state):
        return [str(state.dtype), state.tolist()]
    return [state]


def test_state_dict_round_trip():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=SliceSampler(slice_len=3))
    rb.extend(FakeCollector(2, 2, 9, 0).batch(10))
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(30), sampler=SliceSampler(slice_len=3))
    other.load_state_dict(rb.state_dict())
    assert _flat(other.state_dict()) == _flat(rb.state_dict())


def test_errors():
    with pytest.raises(TypeError, match="expected storage"):
        ReplayBuffer(storage=torch.zeros(3))
    rb = ReplayBuffer(storage=LazyTensorStorage(3))
    with pytest.raises(TypeError, match="use add"):
        rb.extend(TensorDict({"x": torch.tensor(1)}, []))
    with pytest.raises(TypeError, match="TensorDict"):
        rb.extend(torch.zeros(3))
    rb.extend(TensorDict({"x": torch.arange(3)}, [3]))
    with pytest.raises(ValueError, match="expected a batch_size"):
        rb.sample()
    with pytest.raises(FileNotFoundError, match="written by dumps"):
        rb.loads("/nonexistent/path")


# -- transforms on sampled data ---------------------------------------------------------


def _buffer(**kwargs) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(4), batch_size=2, **kwargs)
    rb.extend(TensorDict({"x": torch.zeros(4)}, [4]))
    return rb


def test_append_and_insert_transform_run_in_order_and_chain():
    from tensordict.nn import TensorDictModule

    calls = []

    def tag(name):
        def fn(td):
            calls.append(name)
            return td

        return fn

    add_one = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["x"])
    rb = _buffer(transform=tag("first"))
    assert rb.append_transform(add_one) is rb
    assert rb.insert_transform(1, tag("second")).append_transform(tag("last")) is rb
    sample = rb.sample()
    assert calls == ["first", "second", "last"] and sample["x"].tolist() == [1.0, 1.0]
    assert len(rb.transforms) == 4 and rb.transform is not None
    assert _buffer().transform is None


def test_env_transforms_with_a_forward_run_on_samples():
    from recurrl.envs.transforms import Transform

    class Double(Transform):
        def forward(self, tensordict):
            return tensordict.set("x2", tensordict["x"] * 2 + 1)

    rb = _buffer()
    rb.append_transform(Double(in_keys=["x"], out_keys=["x2"]))
    assert rb.sample()["x2"].tolist() == [1.0, 1.0]


def test_env_transforms_that_need_a_parent_env_are_refused():
    from recurrl.envs.specs import Unbounded
    from recurrl.envs.transforms import Compose, InitTracker, TensorDictPrimer, Transform

    primer = TensorDictPrimer(rs_h=Unbounded((1, 4)))
    for transform in (InitTracker(), Compose(InitTracker()), primer):
        with pytest.raises(ValueError, match="needs a parent env"):
            _buffer().append_transform(transform)
    with pytest.raises(ValueError, match="InitTracker is an env transform"):
        _buffer(transform=InitTracker())

    class ReadsEnv(Transform):
        def forward(self, tensordict):
            return tensordict.set("y", self.parent.observation_spec.zero())

    rb = _buffer(transform=ReadsEnv())
    with pytest.raises(RuntimeError, match="without a parent env"):
        rb.sample()


def test_transform_errors():
    with pytest.raises(TypeError, match="expected a callable"):
        _buffer().append_transform(3)
    with pytest.raises(ValueError, match="invert=True"):
        _buffer().append_transform(lambda td: td, invert=True)
    rb = _buffer(transform=lambda td: None)
    with pytest.raises(TypeError, match="to return a TensorDict"):
        rb.sample()


# ------------------------------------------------- slice batches: fused read vs generic
class _OracleStorage(LazyTensorStorage):
    def get(self, index):  # indexing the stored TensorDict, without the per-tensor gather
        return self.data[index]


def _oracle(cls):
    class Oracle(cls):
        def sample(self, storage, batch_size):  # an override: the buffer's generic path
            return super().sample(storage, batch_size)

    return Oracle


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("num_envs", [None, 3])
@pytest.mark.parametrize(
    "options",
    [{}, {"strict_length": False}, {"strict_length": False, "pad_output": True},
     {"strict_length": False, "min_slice_len": 1}, {"span": True, "strict_length": False},
     {"drop_traj": True}, {"drop_traj": True, "strict_length": False, "pad_output": True},
     {"end_keys": [("next", "done"), ("next", "truncated")]}, {"init_key": None},
     {"truncated_key": None}, {"truncated_key": "cut"}],
)  # fmt: skip
def test_buffer_fast_path_equals_the_generic_path(name, num_envs, options):
    """ReplayBuffer.sample reads a slice sampler's batch with one gather per stored tensor
    and ORs the marks into what it read; the generic path (the sampler's own sample(),
    storage.data[index], info written into the batch) is its oracle: the same generator
    seed gives the same TensorDicts and info, over random episode lengths, extends of
    1..2 * capacity steps (wrapping and overwriting the storage), trajectory-id and
    end-flag modes, whole, short, padded and spanning slices."""
    options = dict(options)
    drop_traj = options.pop("drop_traj", False)
    for seed in range(3):
        rng = random.Random(seed)
        capacity = rng.randint(20, 120)
        slice_len = rng.randint(1, 9)
        num_slices = rng.randint(1, 6)
        buffers = []
        for cls, storage_cls in ((SAMPLERS[name], LazyTensorStorage),
                                 (_oracle(SAMPLERS[name]), _OracleStorage)):  # fmt: skip
            sampler = cls(slice_len=slice_len, generator=torch.Generator().manual_seed(seed),
                          **options)  # fmt: skip
            buffers.append(TensorDictReplayBuffer(storage=storage_cls(capacity),
                                                  sampler=sampler,
                                                  batch_size=num_slices * slice_len))  # fmt: skip
        fast, slow = buffers
        assert _fused_marks(fast.sampler) and not _fused_marks(slow.sampler)
        collector = FakeCollector(num_envs, 1, 3 * slice_len, seed)
        for _ in range(10):
            steps = rng.choice([1, rng.randint(1, 23), rng.randint(capacity, 2 * capacity)])
            if num_envs:
                steps = max(1, steps // num_envs)
            data = collector.batch(steps)
            if drop_traj:
                data = data.exclude(TRAJ)
            for rb in buffers:
                rb.extend(data)
            try:
                want, want_info = slow.sample(return_info=True)
            except RuntimeError:  # no valid start: the fast path raises the same
                with pytest.raises(RuntimeError, match="slice_len"):
                    fast.sample()
                continue
            got, got_info = fast.sample(return_info=True)
            assert set(got.keys(True)) == set(want.keys(True))
            for key, value in want.items(True, True):
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
            assert list(got_info) == list(want_info)
            for key, value in want_info.items():
                assert torch.equal(got_info[key], value), key


def test_priority_updates_reach_the_sampler():
    """update_priority forwards to the sampler; update_tensordict_priority reads "index" and
    priority_key from a sample; a sampler without priorities is refused."""
    data = TensorDict({"x": torch.arange(10), ("next", "done"): torch.zeros(10, 1).bool()}, [10])
    sampler = PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=2)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler,
                                priority_key="loss_td")  # fmt: skip
    rb.extend(data)
    rb.update_priority(torch.tensor([3]), torch.tensor([4.0]))
    assert float(sampler.state_dict()["priority"][3]) == pytest.approx(4.0)
    sample = rb.sample(4)
    sample["loss_td"] = torch.full((4,), 2.0)
    rb.update_tensordict_priority(sample)
    starts = sample["index"].view(2, 2)[:, 0]
    assert torch.allclose(sampler.state_dict()["priority"][starts], torch.tensor(2.0))
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=SliceSampler(slice_len=2))
    plain.extend(data)
    with pytest.raises(TypeError, match="keeps no priorities"):
        plain.update_tensordict_priority(sample.set("td_error", sample["loss_td"]))


def test_extend_update_priority_as_the_reference():
    """extend(data, update_priority=...): the written steps' priorities from priority_key
    (None: when present; True: required; False: never)."""
    episode = torch.zeros(6, dtype=torch.long)

    def buffer():
        sampler = PrioritizedSliceSampler(6, 1.0, 1.0, slice_len=2, traj_key="episode")
        return TensorDictReplayBuffer(storage=LazyTensorStorage(6), sampler=sampler)

    error = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    for update in (None, True):
        rb = buffer()
        rb.extend(TensorDict({"episode": episode, "td_error": error}, [6]), update_priority=update)
        got = rb.sampler.state_dict()["priority"][:6]
        torch.testing.assert_close(got, error + rb.sampler.eps)
    rb = buffer()
    rb.extend(TensorDict({"episode": episode, "td_error": error}, [6]), update_priority=False)
    assert (rb.sampler.state_dict()["priority"][:6] == 1.0).all()  # the default for new data
    rb = buffer()  # an [N, T] batch: written row by row, its priorities in the same order
    rb.extend(TensorDict({"episode": episode.view(2, 3), "td_error": error.view(2, 3)}, [2, 3]))
    torch.testing.assert_close(rb.sampler.state_dict()["priority"][:6], error + rb.sampler.eps)
    with pytest.raises(KeyError, match="no 'td_error' entry"):
        buffer().extend(TensorDict({"episode": episode}, [6]), update_priority=True)
    buffer().extend(TensorDict({"episode": episode}, [6]))  # None: default priorities
    with pytest.raises(ValueError, match="one priority per written step"):
        buffer().extend(TensorDict({"episode": episode, "td_error": torch.ones(6, 2)}, [6]))
    def plain():
        return TensorDictReplayBuffer(storage=LazyTensorStorage(6),
                                      sampler=SliceSampler(slice_len=2))  # fmt: skip

    plain().extend(TensorDict({"episode": episode, "td_error": error}, [6]))  # nothing to do
    with pytest.raises(TypeError, match="keeps no priorities"):
        plain().extend(TensorDict({"episode": episode}, [6]), update_priority=True)
    with pytest.raises(TypeError, match="reads no priorities"):
        ReplayBuffer(storage=LazyTensorStorage(6)).extend(
            TensorDict({"episode": episode}, [6]), update_priority=True
        )
    ReplayBuffer(storage=LazyTensorStorage(6)).extend(
        TensorDict({"episode": episode}, [6]), update_priority=False
    )


def _filled(sampler=None, **kwargs) -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler, batch_size=8, **kwargs)
    episode = torch.arange(64) // 16  # 4 trajectories, for the slice sampler
    rb.extend(TensorDict({"x": torch.arange(64), "episode": episode}, [64]))
    return rb


@pytest.mark.parametrize("how", ["argument", "set_rng"])
def test_a_dedicated_generator_draws_the_samples_and_spares_the_global_stream(how):
    def buffer(seed):
        if how == "argument":
            return _filled(generator=torch.Generator().manual_seed(seed))
        rb = _filled()
        rb.set_rng(torch.Generator().manual_seed(seed))
        return rb

    torch.manual_seed(0)
    state = torch.get_rng_state()
    first = [buffer(1).sample()["x"] for _ in range(2)]
    assert torch.equal(first[0], first[1])  # the same seed, the same draws
    assert not torch.equal(first[0], buffer(2).sample()["x"])
    assert torch.equal(torch.get_rng_state(), state)  # the global stream was not drawn from


def test_the_generator_state_travels_with_the_buffer_state():
    rb = _filled(sampler=SliceSampler(slice_len=4), generator=torch.Generator().manual_seed(3))
    rb.sample()
    state = rb.state_dict()
    expected = rb.sample()["x"]
    other = _filled(sampler=SliceSampler(slice_len=4), generator=torch.Generator().manual_seed(9))
    other.load_state_dict(state)
    assert torch.equal(other.sample()["x"], expected)


def test_generator_errors_say_what_to_do():
    own = RandomSampler(generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"one random generator.*pass the generator to only one"):
        _filled(sampler=own, generator=torch.Generator())
    _filled(sampler=own, generator=own.generator)  # the same one twice is no conflict
    with pytest.raises(TypeError, match=r"expected a torch.Generator, received int.*manual_seed"):
        _filled().set_rng(0)

    class Plain:  # a sampler-like object without a generator
        def sample(self, storage, batch_size):
            return torch.zeros(batch_size, dtype=torch.long), {}

        def extend(self, *args):
            pass

    with pytest.raises(TypeError, match="has no generator attribute"):
        _filled(sampler=Plain(), generator=torch.Generator())


# --- write_count and the buffer's lock ------------------------------------------------------
def test_write_count_counts_every_step_ever_written():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    assert rb.write_count == 0
    rb.extend(FakeCollector(2, 2, 9, 0).batch(3))  # [2, 3]: 6 steps
    rb.add(rb.storage.get(0))  # one step
    assert (rb.write_count, len(rb)) == (7, 7)
    rb.extend(FakeCollector(2, 2, 9, 0).batch(4))  # wraps: len stays at the capacity
    assert (rb.write_count, len(rb)) == (15, 10)
    rb.extend(FakeCollector(3, 2, 9, 0).batch(5))  # more than the capacity: all 15 count
    assert (rb.write_count, len(rb)) == (30, 10)
    with pytest.raises(AttributeError):
        rb.write_count = 0  # read-only, as the reference's


def test_write_count_survives_state_dict_and_dumps(tmp_path):
    def make():
        return TensorDictReplayBuffer(storage=LazyTensorStorage(8),
                                      sampler=SliceSampler(slice_len=2))  # fmt: skip

    rb = make()
    for _ in range(3):
        rb.extend(FakeCollector(2, 2, 9, 0).batch(3))
    assert rb.write_count == 18
    other = make()
    other.load_state_dict(rb.state_dict())
    assert other.write_count == 18
    rb.dumps(tmp_path / "rb")
    other = make()
    other.loads(tmp_path / "rb")
    assert other.write_count == 18
    old = rb.state_dict()
    del old["write_count"]  # saved before write_count existed: what is stored
    other = make()
    other.load_state_dict(old)
    assert other.write_count == len(other) == 8


def test_a_buffer_copies_with_its_own_lock():
    import copy
    import pickle

    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(FakeCollector(2, 2, 9, 0).batch(3))
    for other in (copy.deepcopy(rb), pickle.loads(pickle.dumps(rb))):
        assert other._lock is not rb._lock and other.write_count == 6
        other.extend(FakeCollector(2, 2, 9, 0).batch(1))
        assert (other.write_count, rb.write_count) == (8, 6)


def test_extend_and_sample_hold_the_lock():
    """A sample waits while another thread holds the buffer's lock (as extend does)."""
    import threading

    rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    rb.extend(FakeCollector(2, 2, 9, 0).batch(3))
    done = threading.Event()
    with rb._lock:
        thread = threading.Thread(target=lambda: (rb.sample(), done.set()))
        thread.start()
        assert not done.wait(0.2)  # blocked on the lock
        rb.extend(FakeCollector(2, 2, 9, 0).batch(1))  # reentrant for the holder
    assert done.wait(10)
    thread.join()
