"""Tests of a Collector writing into a replay buffer: ``replay_buffer=`` (iteration yields
None, the buffer holds exactly the batches), ``start()`` / ``async_shutdown()`` (a background
thread: total_frames, errors, threads left, weights, sampling while it writes) and the
``SyncDataCollector`` name."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector, SyncDataCollector
from recurrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler, TensorDictReplayBuffer
from recurrl.modules import LSTMModule, set_recurrent_mode
from recurrl.testing import CountingEnv

H = 8
STATE_KEYS = ["rs_h", "rs_c"]
LENGTHS = [5, 7, 9]
N = len(LENGTHS)
T = 8  # steps per env per batch
THREAD = "recurrl-Collector"


def make_policy(seed: int = 0):
    """An LSTM policy; the action is ``argmax(head.bias)`` (the head's weight is zero), so a
    change of the head's bias shows in the collected actions."""
    torch.manual_seed(seed)
    lstm = LSTMModule(
        3, H, in_keys=["observation", *STATE_KEYS],
        out_keys=["features", *(("next", k) for k in STATE_KEYS)],
    )  # fmt: skip
    head = nn.Linear(H, 2)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([1.0, 0.0]))
    policy = Seq(
        lstm,
        Mod(head, in_keys=["features"], out_keys=["logits"]),
        Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    )
    return lstm, head, policy


def make_collector(rb=None, *, total_frames: int = -1, env=None, policy=None, **kwargs):
    if policy is None:
        _, _, policy = make_policy()
    env = env if env is not None else CountingEnv(batch_size=(N,), max_steps=LENGTHS)
    return Collector(env, policy, frames_per_batch=N * T, total_frames=total_frames,
                     replay_buffer=rb, **kwargs)  # fmt: skip


def stored(rb) -> TensorDict:
    return rb.storage.get(torch.arange(len(rb)))


def collector_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD]


def wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.01)


class FailingEnv(CountingEnv):
    """Raises at its ``fail_at``-th step."""

    def __init__(self, fail_at: int, **kwargs):
        super().__init__(**kwargs)
        self.fail_at, self.steps = fail_at, 0

    def _step(self, tensordict):
        self.steps += 1
        if self.steps == self.fail_at:
            raise ValueError(f"FailingEnv: broken at step {self.steps}")
        return super()._step(tensordict)


class GatedEnv(CountingEnv):
    """Steps only while ``gate`` is set (so a test can hold the thread inside a batch)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.gate = threading.Event()

    def _step(self, tensordict):
        assert self.gate.wait(30), "GatedEnv: the gate was never opened"
        return super()._step(tensordict)


# --- replay_buffer= while iterating -----------------------------------------------------------
def test_iterating_with_a_buffer_yields_none_and_stores_exactly_the_batches():
    reference = make_collector(total_frames=3 * N * T)
    batches = list(reference)
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    collector = make_collector(rb, total_frames=3 * N * T)
    assert list(collector) == [None, None, None]
    assert rb.write_count == len(rb) == 3 * N * T == collector.frames
    # row by row, batch after batch: every key (hidden states, is_init, ids) as yielded
    expected = torch.cat([b.reshape(-1) for b in batches])
    got = stored(rb)
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        assert torch.equal(got[key], expected[key]), key
    assert got["is_init"].any() and got["rs_h"].abs().sum() > 0  # not trivially equal


def test_rollout_does_not_write_into_the_buffer():
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    collector = make_collector(rb)
    assert collector.rollout().batch_size == (N, T)
    assert rb.write_count == 0


def test_bad_buffer_arguments_are_refused():
    with pytest.raises(TypeError, match="extend"):
        make_collector(object())
    with pytest.raises(ValueError, match=r"extend_buffer=False.*Fix: drop extend_buffer"):
        make_collector(ReplayBuffer(storage=LazyTensorStorage(10)), extend_buffer=False)


def test_sync_data_collector_is_the_collector():
    assert SyncDataCollector is Collector


# --- start / async_shutdown -----------------------------------------------------------------
def test_start_collects_total_frames_in_a_thread_and_stores_the_batches():
    before = threading.active_count()
    reference = list(make_collector(total_frames=4 * N * T))
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    collector = make_collector(rb, total_frames=4 * N * T - 5)  # rounded up to 4 batches
    collector.start()
    assert collector_threads()
    wait_for(lambda: not collector.is_running())
    assert rb.write_count == collector.frames == 4 * N * T
    expected = torch.cat([b.reshape(-1) for b in reference])
    got = stored(rb)
    for key in expected.keys(True, True):
        assert torch.equal(got[key], expected[key]), key
    collector.async_shutdown()
    assert not collector_threads() and threading.active_count() == before
    collector.async_shutdown()  # idempotent
    collector.shutdown()


def test_start_without_a_buffer_is_refused_with_the_fix():
    collector = make_collector()
    with pytest.raises(RuntimeError, match="replay_buffer=rb"):
        collector.start()
    collector.shutdown()


def test_async_shutdown_stops_an_endless_thread_and_leaves_none():
    rb = ReplayBuffer(storage=LazyTensorStorage(500))
    collector = make_collector(rb)
    collector.start()
    collector.start()  # a no-op while running
    assert len(collector_threads()) == 1
    wait_for(lambda: rb.write_count >= 3 * N * T)
    collector.async_shutdown(timeout=30)
    assert not collector_threads()
    assert rb.write_count == collector.frames and rb.write_count % (N * T) == 0
    with pytest.raises(RuntimeError, match="after shutdown"):
        collector.start()


def test_the_collector_refuses_the_env_from_two_threads_and_resumes_after_a_stop():
    rb = ReplayBuffer(storage=LazyTensorStorage(20_000))
    collector = make_collector(rb)
    collector.start()
    wait_for(lambda: rb.write_count >= N * T)
    for call in (collector.rollout, lambda: next(iter(collector)), collector.state_dict,
                 lambda: collector.set_seed(0)):  # fmt: skip
        with pytest.raises(RuntimeError, match=r"async_shutdown\(close_env=False\)"):
            call()
    collector.async_shutdown(close_env=False)  # the thread stops, the env stays open
    assert not collector_threads()
    frames = collector.frames
    data = collector.rollout()  # trajectories go on where the thread left them
    assert collector.frames == frames + N * T
    assert rb.write_count == len(rb) < 20_000  # nothing overwritten: the last rows are last
    last = stored(rb)[-N * T :].reshape(N, T)
    continues = ~data["is_init"][:, 0, 0]
    assert torch.equal(
        data["observation"][:, 0][continues], last["next", "observation"][:, -1][continues]
    )
    assert int(data["collector", "traj_ids"].min()) >= int(last["collector", "traj_ids"].min())
    written = rb.write_count  # the rollout above was returned, not written
    collector.start()  # and may collect in the background again
    wait_for(lambda: rb.write_count >= written + N * T)
    collector.async_shutdown()
    assert not collector_threads()


def test_a_thread_error_is_raised_by_async_shutdown_after_closing():
    rb = ReplayBuffer(storage=LazyTensorStorage(500))
    env = FailingEnv(fail_at=2 * T + 3, batch_size=(N,), max_steps=LENGTHS)
    collector = make_collector(rb, env=env)
    collector.start()
    wait_for(lambda: not collector._thread.is_alive())
    with pytest.raises(ValueError, match="broken at step") as info:
        collector.async_shutdown()
    assert "background thread" in "".join(getattr(info.value, "__notes__", ["background thread"]))
    assert not collector_threads() and collector._closed
    assert rb.write_count == 2 * N * T  # the two whole batches before the failure
    collector.async_shutdown()  # reported once; idempotent


def test_a_thread_error_is_raised_by_the_next_interaction_then_refuses_to_go_on():
    rb = ReplayBuffer(storage=LazyTensorStorage(500))
    env = FailingEnv(fail_at=3, batch_size=(N,), max_steps=LENGTHS)
    collector = make_collector(rb, env=env)
    collector.start()
    wait_for(lambda: not collector._thread.is_alive())
    with pytest.raises(ValueError, match="broken at step 3"):
        collector.update_policy_weights_()
    with pytest.raises(RuntimeError, match="background thread failed"):
        collector.rollout()
    with pytest.raises(RuntimeError, match="background thread failed"):
        collector.start()
    assert collector.is_running() is False
    collector.async_shutdown()  # already reported: closes without raising
    assert not collector_threads()


def test_is_running_reports_a_thread_error():
    rb = ReplayBuffer(storage=LazyTensorStorage(500))
    env = FailingEnv(fail_at=3, batch_size=(N,), max_steps=LENGTHS)
    collector = make_collector(rb, env=env)
    collector.start()
    with pytest.raises(ValueError, match="broken at step 3"):
        wait_for(lambda: not collector.is_running())
    collector.shutdown()


def test_async_shutdown_timeout_leaves_the_env_open_and_can_be_retried():
    rb = ReplayBuffer(storage=LazyTensorStorage(500))
    env = GatedEnv(batch_size=(N,), max_steps=LENGTHS)
    collector = make_collector(rb, env=env)
    collector.start()
    with pytest.raises(TimeoutError, match="did not finish its batch"):
        collector.async_shutdown(timeout=0.05)
    assert collector_threads() and not collector._closed
    env.gate.set()
    collector.async_shutdown()
    assert not collector_threads() and collector._closed
    assert rb.write_count == N * T  # the batch in progress was finished and written


def test_the_thread_acts_with_the_callers_weights():
    _, head, policy = make_policy()
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000))
    collector = make_collector(rb, policy=policy)
    collector.start()
    wait_for(lambda: rb.write_count >= N * T)
    with torch.no_grad():  # an in-place update, as an optimizer step makes
        head.bias.copy_(torch.tensor([0.0, 1.0]))
    changed_at = rb.write_count
    wait_for(lambda: rb.write_count >= changed_at + 2 * N * T)
    # update_policy_weights_ lands between two steps of the thread
    weights = {**policy.state_dict(), "module.1.module.bias": torch.tensor([2.0, 0.0])}
    collector.update_policy_weights_(weights)
    updated_at = rb.write_count
    wait_for(lambda: rb.write_count >= updated_at + 2 * N * T)
    collector.async_shutdown()
    actions = stored(rb)["action"]
    assert (actions[: N * T] == 0).all()
    assert (actions[changed_at + N * T : changed_at + 2 * N * T] == 1).all()
    assert (actions[-N * T :] == 0).all()
    assert torch.equal(head.bias, torch.tensor([2.0, 0.0]))  # the caller's policy itself


def test_sampling_while_the_thread_writes_gives_whole_single_trajectory_slices():
    """Every slice sampled while the thread extends the (wrapping) buffer is contiguous (the
    observation counts up by one), within one trajectory, starts with is_init and has no
    other, and replays in recurrent mode from its stored state to the stored features."""
    lstm, _, policy = make_policy()
    num_slices, slice_len = 4, 4
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(10 * N * T), sampler=SliceSampler(num_slices=num_slices),
        batch_size=num_slices * slice_len,
    )  # fmt: skip
    collector = make_collector(rb, policy=policy, total_frames=60 * N * T)
    collector.start()
    wait_for(lambda: rb.write_count >= 2 * N * T)
    samples, seen_counts = 0, set()
    while collector.is_running() or samples < 5:
        seen_counts.add(rb.write_count)
        data = rb.sample().reshape(num_slices, slice_len)
        samples += 1
        obs = data["observation"][..., 0]
        assert (obs[:, 1:] == obs[:, :-1] + 1).all()
        ids = data["collector", "traj_ids"]
        assert (ids == ids[:, :1]).all()
        is_init = data["is_init"].squeeze(-1)
        assert is_init[:, 0].all() and not is_init[:, 1:].any()
        replay = data.exclude("features", *(("next", k) for k in STATE_KEYS))
        with torch.no_grad(), set_recurrent_mode(True):
            lstm(replay)
        torch.testing.assert_close(replay["features"], data["features"], atol=1e-5, rtol=1e-4)
    collector.async_shutdown()
    assert rb.write_count == 60 * N * T
    assert len(seen_counts) > 2  # sampled while the thread was writing
