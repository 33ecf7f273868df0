"""Tests of recurrl.collectors.Collector: batches, hidden-state carrying, trajectory ids,
auto-wiring of the recurrent env transforms, resumption and shutdown."""

from __future__ import annotations

import itertools
import multiprocessing
import re
import traceback

import gymnasium
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.collectors.collector import _CHUNK_STEPS, MissingPolicyTransformsError
from recurrl.envs import (
    Compose,
    GymEnv,
    InitTracker,
    TensorDictPrimer,
    TransformedEnv,
    find_transform,
)
from recurrl.modules import LSTMModule, set_recurrent_mode
from recurrl.testing import CountingEnv

H = 8
LENGTHS = [2, 3, 5]
STATE_KEYS = ["rs_h", "rs_c"]


def make_policy(obs_dim: int = 3, n_actions: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    lstm = LSTMModule(
        obs_dim,
        H,
        in_keys=["observation", *STATE_KEYS],
        out_keys=["features", *(("next", k) for k in STATE_KEYS)],
    )
    policy = Seq(
        lstm,
        Mod(nn.Linear(H, n_actions), in_keys=["features"], out_keys=["logits"]),
        Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    )
    return lstm, policy


def collect(n_batches: int, *, frames_per_batch: int = 21, lengths=LENGTHS, **kwargs):
    lstm, policy = make_policy()
    batch_size = (len(lengths),) if isinstance(lengths, list) else ()
    env = CountingEnv(batch_size=batch_size, max_steps=lengths)
    collector = Collector(env, policy, frames_per_batch=frames_per_batch, **kwargs)
    batches = list(itertools.islice(collector, n_batches))
    return lstm, collector, batches


def expected_is_init(lengths, steps: int) -> torch.Tensor:
    return torch.tensor([[t % n == 0 for t in range(steps)] for n in lengths])


# --- shapes and keys ---------------------------------------------------------------------
def test_batch_shapes_single_and_batched():
    _, _, batches = collect(2, frames_per_batch=7, lengths=4)
    assert [b.batch_size for b in batches] == [torch.Size([7])] * 2
    _, _, batches = collect(2, frames_per_batch=12)
    assert [b.batch_size for b in batches] == [torch.Size([3, 4])] * 2
    data = batches[0]
    for key in [
        "observation",
        "is_init",
        *STATE_KEYS,
        "action",
        "features",
        "logits",
        ("next", "observation"),
        ("next", "reward"),
        ("next", "done"),
        *(("next", k) for k in STATE_KEYS),
    ]:
        assert key in data.keys(include_nested=True), key
    assert data["collector", "traj_ids"].shape == (3, 4)
    assert data["collector", "traj_ids"].dtype == torch.int64
    assert data["rs_h"].shape == (3, 4, 1, H)


def test_invalid_arguments():
    _lstm, policy = make_policy()
    env = CountingEnv(batch_size=(3,))
    with pytest.raises(ValueError, match="not a multiple of the number of envs 3"):
        Collector(env, policy, frames_per_batch=10)
    with pytest.raises(ValueError, match="split_trajs=True is not supported"):
        Collector(env, policy, frames_per_batch=9, split_trajs=True)
    with pytest.raises(ValueError, match="total_frames"):
        Collector(env, policy, frames_per_batch=9, total_frames=0)
    with pytest.raises(TypeError, match="EnvBase"):
        Collector("CartPole-v1", policy, frames_per_batch=9)


def test_env_factory_and_random_policy():
    torch.manual_seed(0)
    collector = Collector(
        lambda: CountingEnv(batch_size=(2,)),
        frames_per_batch=6,
        total_frames=12,
        storing_device="cpu",
    )
    batches = list(collector)
    assert len(batches) == 2 and batches[0].batch_size == (2, 3)
    assert batches[0]["action"].dtype == torch.int64
    assert "is_init" not in batches[0]  # nothing recurrent: the env is untouched
    assert batches[1]["collector", "traj_ids"].tolist() == [[0, 0, 2], [1, 1, 3]]


# --- episode boundaries, trajectory ids, hidden state -------------------------------------
def test_is_init_exactly_at_episode_starts_across_batches():
    _, _, batches = collect(3)
    data = torch.cat(batches, dim=1)
    assert data["is_init"].squeeze(-1).tolist() == expected_is_init(LENGTHS, 21).tolist()
    # the observation is the step count since the last reset
    obs = data["observation"][..., 0]
    expected = torch.tensor([[t % n for t in range(21)] for n in LENGTHS], dtype=obs.dtype)
    torch.testing.assert_close(obs, expected)


def test_traj_ids_change_exactly_at_is_init_and_are_unique():
    _, _, batches = collect(3)
    data = torch.cat(batches, dim=1)
    ids = data["collector", "traj_ids"]
    is_init = data["is_init"].squeeze(-1)
    assert ids[:, 0].tolist() == [0, 1, 2]
    changed = ids[:, 1:] != ids[:, :-1]
    assert changed.tolist() == is_init[:, 1:].tolist()
    # unique across envs, one id per trajectory, no id skipped
    owners = {}
    for env_index, row in enumerate(ids.tolist()):
        for i in row:
            assert owners.setdefault(i, env_index) == env_index
    assert sorted(owners) == list(range(int(is_init.sum())))
    # ids persist across the batch boundary (no trajectory starts there for env 0 at t=7)
    assert batches[1]["collector", "traj_ids"][0, 0] == batches[0]["collector", "traj_ids"][0, -1]


def test_hidden_state_carried_across_steps_and_batches():
    _, _, batches = collect(3)
    data = torch.cat(batches, dim=1)
    is_init = data["is_init"].squeeze(-1)
    for key in STATE_KEYS:
        # zeros at every episode start (primer), nonzero elsewhere (the LSTM ran)
        assert data[key][is_init].abs().max() == 0
        assert (data[key][~is_init].abs().sum((-1, -2)) > 0).all()
        carried = ~is_init[:, 1:]  # includes t = 6 -> 7 and 13 -> 14: batch boundaries
        torch.testing.assert_close(
            data[key][:, 1:][carried], data["next", key][:, :-1][carried], rtol=0, atol=0
        )


@pytest.mark.parametrize("seed", range(8))
def test_collected_batches_are_not_modified_by_later_steps(seed):
    # Partial resets fill and merge the carried root out of place: a batch handed out (and
    # every chunk stacked into it) keeps its values while the collector goes on stepping
    # from the states it holds.
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 6, (int(torch.randint(2, 5, (), generator=g)),), generator=g)
    frames = len(lengths) * (_CHUNK_STEPS + int(torch.randint(1, 9, (), generator=g)))
    _, policy = make_policy()
    env = CountingEnv(batch_size=(len(lengths),), max_steps=lengths.tolist())
    collector = Collector(env, policy, frames_per_batch=frames)
    batches, copies = [], []
    for batch in itertools.islice(collector, 3):
        batches.append(batch)
        copies.append(batch.clone())
    for batch, copy in zip(batches, copies):
        assert (batch == copy).all()
    data = torch.cat(batches, dim=1)
    is_init = data["is_init"].squeeze(-1)
    for key in STATE_KEYS:  # no state crosses an episode start
        assert data[key][is_init].abs().max() == 0
        # the states the policy wrote, the root's at the next step, are the LSTM's (never
        # zero) also where that next root was reset: the reset did not write into them
        assert (data["next", key].abs().sum((-1, -2)) > 0).all()


@pytest.mark.parametrize("backend", ["pad", "scan"])
def test_recurrent_replay_reproduces_collected_features(backend):
    lstm, _, batches = collect(3)
    lstm.recurrent_backend = backend
    # batch 2 starts mid-episode for every env: replay starts from the stored state
    for data in batches:
        replay = data.clone()
        del replay["features"]
        for key in STATE_KEYS:
            del replay["next", key]
        with set_recurrent_mode(True):
            lstm(replay)
        torch.testing.assert_close(replay["features"], data["features"], atol=1e-5, rtol=1e-4)
        # the state after the last step is exact (trajectory end), so the next batch goes on
        for key in STATE_KEYS:
            torch.testing.assert_close(
                replay["next", key][:, -1], data["next", key][:, -1], atol=1e-5, rtol=1e-4
            )


def test_same_steps_as_env_rollout():
    """The collector's fast step_mdp gives exactly what env.rollout does."""
    _, policy = make_policy()
    _, _, batches = collect(1, frames_per_batch=24)
    env = TransformedEnv(
        CountingEnv(batch_size=(3,), max_steps=LENGTHS),
        Compose(InitTracker(), make_policy()[0].make_tensordict_primer()),
    )
    with torch.no_grad():
        expected = env.rollout(8, policy, break_when_any_done=False)
    data = batches[0].exclude("collector")
    assert set(data.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        torch.testing.assert_close(data[key], expected[key], rtol=0, atol=0)


def test_batches_longer_than_a_chunk_match_env_rollout():
    """Steps are stacked by chunks as they come: a batch of several chunks and a remainder
    is the same as one stack of all its steps."""
    steps = 2 * _CHUNK_STEPS + 5
    _, policy = make_policy()
    _, _, batches = collect(1, frames_per_batch=3 * steps)
    env = TransformedEnv(
        CountingEnv(batch_size=(3,), max_steps=LENGTHS),
        Compose(InitTracker(), make_policy()[0].make_tensordict_primer()),
    )
    with torch.no_grad():
        expected = env.rollout(steps, policy, break_when_any_done=False)
    data = batches[0]
    assert data.batch_size == (3, steps)
    ids, is_init = data["collector", "traj_ids"], data["is_init"].squeeze(-1)
    assert torch.equal(ids[:, 1:] != ids[:, :-1], is_init[:, 1:])  # across chunk ends too
    data = data.exclude("collector")
    for key in expected.keys(True, True):
        torch.testing.assert_close(data[key], expected[key], rtol=0, atol=0)


def test_policy_writing_other_keys_in_a_later_chunk_raises():
    lstm, policy = make_policy()
    calls = []

    def changing(td):
        calls.append(1)
        td = policy(td)
        if len(calls) > _CHUNK_STEPS:
            td.set("extra", torch.zeros(td.batch_size))
        return td

    env = TransformedEnv(
        CountingEnv(max_steps=5), Compose(InitTracker(), lstm.make_tensordict_primer())
    )
    collector = Collector(env, changing, frames_per_batch=_CHUNK_STEPS + 4)
    with pytest.raises(RuntimeError, match="a policy must write the same keys at every step"):
        collector.rollout()


# --- auto-registration of InitTracker and primers ----------------------------------------
def _count(env):
    return len(find_transform(env, InitTracker)), len(find_transform(env, TensorDictPrimer))


def test_auto_registration_adds_init_tracker_and_primer_once():
    _, policy = make_policy()
    base = CountingEnv()
    collector = Collector(base, policy, frames_per_batch=4)
    assert isinstance(collector.env, TransformedEnv) and collector.env.base_env is base
    assert _count(collector.env) == (1, 1)
    assert {"is_init", *STATE_KEYS} <= set(collector.env.observation_spec.keys())
    assert set(STATE_KEYS) <= set(collector.env.state_spec.keys())
    # a second collector on the wired env adds nothing
    again = Collector(collector.env, policy, frames_per_batch=4)
    assert again.env is collector.env and _count(again.env) == (1, 1)
    next(iter(again))


def test_auto_registration_keeps_a_wired_env_and_completes_a_partial_one():
    lstm, policy = make_policy()
    wired = TransformedEnv(CountingEnv(), Compose(InitTracker(), lstm.make_tensordict_primer()))
    assert Collector(wired, policy, frames_per_batch=4).env is wired
    assert _count(wired) == (1, 1)
    only_tracker = TransformedEnv(CountingEnv(), InitTracker())
    first = Collector(only_tracker, policy, frames_per_batch=4)
    second = Collector(only_tracker, policy, frames_per_batch=4)  # same env, two collectors
    assert first.env is only_tracker and second.env is only_tracker
    assert _count(only_tracker) == (1, 1)
    only_primer = TransformedEnv(CountingEnv(), lstm.make_tensordict_primer())
    Collector(only_primer, policy, frames_per_batch=4)
    assert _count(only_primer) == (1, 1)
    assert next(iter(Collector(only_primer, policy, frames_per_batch=4)))["is_init"][0]


def test_missing_transforms_without_auto_registration_fail_loudly():
    lstm, policy = make_policy()
    with pytest.raises(ValueError, match=r"InitTracker.*TensorDictPrimer.*'rs_h', 'rs_c'") as err:
        Collector(CountingEnv(), policy, frames_per_batch=4, auto_register_policy_transforms=False)
    assert "auto_register_policy_transforms=True" in str(err.value)
    env = TransformedEnv(CountingEnv(), InitTracker())
    with pytest.raises(ValueError, match="TensorDictPrimer") as err:
        Collector(env, policy, frames_per_batch=4, auto_register_policy_transforms=False)
    assert "an InitTracker" not in str(err.value)
    wired = env.append_transform(lstm.make_tensordict_primer())
    Collector(wired, policy, frames_per_batch=4, auto_register_policy_transforms=False)


def test_missing_is_init_is_also_a_key_error_with_a_readable_message():
    _, policy = make_policy()
    with pytest.raises(KeyError) as err:  # what code written for the reference catches
        Collector(CountingEnv(), policy, frames_per_batch=4, auto_register_policy_transforms=False)
    assert isinstance(err.value, ValueError)
    assert isinstance(err.value, MissingPolicyTransformsError)
    message = str(err.value)
    assert "'is_init'" in message and message.startswith("Collector: the policy has")
    assert "policy=policy" in message  # names the env-constructor fix too
    assert not message.startswith('"')  # not KeyError's repr-quoted str()
    assert err.value.args == (message,)
    assert "Collector: the policy has" in "".join(traceback.format_exception_only(err.value))


# --- policy_factory -----------------------------------------------------------------------
def test_policy_factory_builds_the_policy_once_and_is_wired_like_policy():
    calls = []

    def factory():
        calls.append(1)
        return make_policy(seed=3)[1]

    env = CountingEnv(batch_size=(2,), max_steps=3)
    collector = Collector(env, policy_factory=factory, frames_per_batch=8, total_frames=16)
    assert len(calls) == 1 and isinstance(collector.policy, Seq)
    assert _count(collector.env) == (1, 1)  # auto-wired from the built policy
    batches = list(collector)
    assert len(calls) == 1 and len(batches) == 2
    # same data as the same policy given directly
    reference = list(
        Collector(
            CountingEnv(batch_size=(2,), max_steps=3),
            make_policy(seed=3)[1],
            frames_per_batch=8,
            total_frames=16,
        )
    )
    for a, b in zip(batches, reference, strict=True):
        assert torch.equal(a["action"], b["action"]) and torch.equal(a["rs_h"], b["rs_h"])
    before = [p.clone() for p in collector.policy.parameters()]
    collector.update_policy_weights_()  # nothing to refresh: the collector owns its policy
    assert all(torch.equal(a, b) for a, b in zip(before, collector.policy.parameters()))
    state = make_policy(seed=4)[1].state_dict()
    collector.update_policy_weights_(state)
    key = "module.0.lstm.weight_ih_l0"
    assert torch.equal(collector.policy.state_dict()[key], state[key])


def test_policy_factory_through_ray_collector_kwargs(ray_session):
    """Each remote collector of a RayCollector builds its own policy from the factory."""
    import copy
    import functools

    from recurrl.collectors import RayCollector

    _, policy = make_policy(seed=3)
    env_fn = functools.partial(CountingEnv, batch_size=(2,), max_steps=3)
    collector = RayCollector(
        [env_fn],
        frames_per_batch=8,
        total_frames=8,
        collector_kwargs={"policy_factory": functools.partial(copy.deepcopy, policy)},
    )
    try:
        (data,) = list(collector)
    finally:
        collector.shutdown()
    local = next(iter(Collector(env_fn(), policy, frames_per_batch=8)))
    assert torch.equal(data["action"], local["action"])
    assert torch.equal(data["next", "rs_h"], local["next", "rs_h"])


def test_policy_factory_errors():
    _, policy = make_policy()
    with pytest.raises(TypeError, match="mutually exclusive"):
        Collector(CountingEnv(), policy, policy_factory=lambda: policy, frames_per_batch=4)
    with pytest.raises(TypeError, match=r"expected policy_factory a callable.*received Ordered"):
        Collector(CountingEnv(), policy_factory=policy.state_dict(), frames_per_batch=4)
    with pytest.raises(TypeError, match=r"policy_factory\(\) returned NoneType"):
        Collector(CountingEnv(), policy_factory=lambda: None, frames_per_batch=4)
    with pytest.raises(ValueError, match="InitTracker") as err:
        Collector(
            CountingEnv(),
            policy_factory=lambda: policy,
            frames_per_batch=4,
            auto_register_policy_transforms=False,
        )
    assert isinstance(err.value, KeyError)


# --- stopping, resetting, resuming, weights ------------------------------------------------
def test_total_frames_rounded_up_to_whole_batches():
    _, collector, batches = collect(10, frames_per_batch=9, total_frames=25)
    assert len(batches) == 3 == len(collector)
    assert collector.frames == 27
    assert list(collector) == []  # exhausted


def test_reset_at_each_iter():
    _, _, batches = collect(3, frames_per_batch=6, lengths=[100, 100], reset_at_each_iter=True)
    for i, data in enumerate(batches):
        assert data["observation"][:, 0, 0].tolist() == [0.0, 0.0]
        assert data["is_init"][:, :, 0].tolist() == [[True, False, False]] * 2
        assert data["collector", "traj_ids"][:, 0].tolist() == [2 * i, 2 * i + 1]
    _, _, batches = collect(2, frames_per_batch=6, lengths=[100, 100])
    assert batches[1]["observation"][:, 0, 0].tolist() == [3.0, 3.0]


class BufferedCountingEnv(CountingEnv):
    """CountingEnv whose step counter is a registered buffer: it is in env.state_dict()."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        count = self.count
        del self.count
        self.register_buffer("count", count)


def test_state_dict_resumes_exactly():
    def make(seed):
        _, policy = make_policy(seed=seed)
        env = BufferedCountingEnv(batch_size=(3,), max_steps=LENGTHS)
        return Collector(env, policy, frames_per_batch=12)

    reference = make(0)
    _first, second, third = itertools.islice(reference, 3)
    interrupted = make(0)
    next(iter(interrupted))
    state = interrupted.state_dict()
    interrupted.shutdown()
    resumed = make(seed=1)  # other weights: they come from the state dict
    resumed.load_state_dict(state)
    batches = list(itertools.islice(resumed, 2))
    assert resumed.frames == 36
    for got, expected in zip(batches, (second, third), strict=True):
        assert set(got.keys(True, True)) == set(expected.keys(True, True))
        for key in expected.keys(True, True):
            torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)


def test_state_dict_without_env_state_restarts_with_fresh_ids():
    _, collector, _ = collect(1)
    state = collector.state_dict()
    assert state["env"] == {}  # CountingEnv's counter is not a buffer
    _, resumed, _ = collect(0)
    resumed.load_state_dict(state)
    data = next(iter(resumed))
    assert data["is_init"][:, 0].all()  # restarted
    assert data["collector", "traj_ids"][:, 0].tolist() == [
        state["next_traj_id"] + i for i in range(3)
    ]


def test_update_policy_weights():
    _, policy = make_policy()
    collector = Collector(CountingEnv(), policy, frames_per_batch=4, device="cpu")
    assert collector.policy is policy
    collector.update_policy_weights_()  # shares the weights: no-op
    collector.update_policy_weights_(TensorDict.from_module(policy))  # same tensors: no-op
    _, other = make_policy(seed=1)
    collector.update_policy_weights_(other.state_dict())
    torch.testing.assert_close(policy[1].module.weight, other[1].module.weight)
    zeros = TensorDict.from_module(other).clone().zero_()
    collector.update_policy_weights_(zeros)
    assert policy[1].module.weight.abs().sum() == 0


def test_init_random_frames():
    _, _, batches = collect(2, frames_per_batch=6, init_random_frames=6)
    assert "logits" not in batches[0] and "logits" in batches[1]


def test_shutdown():
    _, collector, _ = collect(1)
    collector.shutdown()
    collector.shutdown()  # idempotent
    assert collector.env.is_closed
    with pytest.raises(RuntimeError, match="shutdown"):
        next(iter(collector))
    with Collector(CountingEnv(), None, frames_per_batch=2) as ctx:
        next(iter(ctx))
    assert ctx.env.is_closed


# --- gymnasium ---------------------------------------------------------------------------
def test_tutorial_usage_cartpole():
    _, policy = make_policy(obs_dim=4)
    collector = Collector(
        GymEnv("CartPole-v1", seed=0),
        policy,
        frames_per_batch=64,
        total_frames=512,
        device="cpu",
        storing_device="cpu",
        auto_register_policy_transforms=True,
        reset_at_each_iter=False,
    )
    batches = list(collector)
    assert [b.batch_size for b in batches] == [torch.Size([64])] * 8
    assert sorted(batches[0].keys()) == [
        "action",
        "collector",
        "done",
        "features",
        "is_init",
        "logits",
        "next",
        "observation",
        "rs_c",
        "rs_h",
        "terminated",
        "truncated",
    ]
    assert batches[0]["next", "rs_h"].shape == (64, 1, H)
    data = torch.cat(batches)
    ends = data["next", "done"].squeeze(-1)[:-1]
    assert data["is_init"].squeeze(-1)[1:].tolist() == ends.tolist()
    collector.shutdown()


class CrashEnv(gymnasium.Env):
    """Raises inside its (worker) process at the third step."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == 3:
            raise ValueError("worker boom in crash_step")
        return np.zeros(4, dtype=np.float32), 0.0, False, False, {}


gymnasium.register(id="RecurrlTestCrash-v0", entry_point=CrashEnv)


def test_async_gym_workers_feed_one_policy_and_shut_down(fail_after):
    lstm, policy = make_policy(obs_dim=4)
    before = set(multiprocessing.active_children())  # other tests' processes are not ours
    env = GymEnv("CartPole-v1", num_envs=3, vectorization="async")
    collector = Collector(env, policy, frames_per_batch=60, total_frames=120)
    assert len(set(multiprocessing.active_children()) - before) == 3
    with fail_after(60):
        batches = list(collector)
    assert [b.batch_size for b in batches] == [torch.Size([3, 20])] * 2
    data = torch.cat(batches, dim=1)
    is_init = data["is_init"].squeeze(-1)
    assert is_init[:, 1:].tolist() == data["next", "done"].squeeze(-1)[:, :-1].tolist()
    with set_recurrent_mode(True):
        replay = lstm(data.exclude("features"))
    torch.testing.assert_close(replay["features"], data["features"], atol=1e-5, rtol=1e-4)
    with fail_after(30):
        collector.shutdown()
    assert set(multiprocessing.active_children()) - before == set()


def test_async_worker_crash_raises_with_worker_traceback(fail_after):
    before = set(multiprocessing.active_children())
    collector = Collector(
        GymEnv("RecurrlTestCrash-v0", num_envs=2, vectorization="async"), None, frames_per_batch=10
    )
    with fail_after(30), pytest.raises(ValueError, match="worker boom") as err:
        next(iter(collector))
    # the worker's own frame (CrashEnv.step, run in the subprocess) is in the traceback
    text = "".join(traceback.format_exception(err.value))
    assert re.search(r'test_collector\.py", line \d+, in step\n', text), text
    collector.shutdown()
    assert set(multiprocessing.active_children()) - before == set()


def test_shutdown_returns_after_a_worker_was_killed(fail_after):
    import recurrl.testing.gym_envs  # noqa: F401  (registers RecurrlFaulty-v0)
    from recurrl.envs.gym_async import WorkerDiedError

    before = set(multiprocessing.active_children())
    env = GymEnv(
        "RecurrlFaulty-v0", num_envs=2, vectorization="async", fault="sigkill", fault_step=3
    )
    collector = Collector(env, None, frames_per_batch=10)
    with fail_after(30):
        with pytest.raises(WorkerDiedError, match=r"died, killed by signal SIGKILL"):
            next(iter(collector))
        collector.shutdown()
        collector.shutdown()  # idempotent
    assert set(multiprocessing.active_children()) - before == set()


# --- trajectory-id layout (offset / stride) ------------------------------------------------
def test_traj_id_offset_and_stride():
    _, _, plain = collect(2, frames_per_batch=12)
    _, collector, strided = collect(2, frames_per_batch=12, traj_id_offset=2, traj_id_stride=5)
    for a, b in zip(plain, strided, strict=True):
        ids = a["collector", "traj_ids"]
        assert b["collector", "traj_ids"].tolist() == (ids * 5 + 2).tolist()
    state = collector.state_dict()
    assert (state["traj_id_offset"], state["traj_id_stride"]) == (2, 5)
    _, resumed, _ = collect(0)
    resumed.load_state_dict(state)
    assert (resumed.traj_id_offset, resumed.traj_id_stride) == (2, 5)
    data = next(iter(resumed))  # restarted (CountingEnv has no env state): fresh ids
    assert data["collector", "traj_ids"][:, 0].tolist() == [
        2 + 5 * (state["next_traj_id"] + i) for i in range(3)
    ]


def test_old_state_dicts_without_traj_id_layout_load_as_0_1():
    _, collector, _ = collect(1, traj_id_offset=1, traj_id_stride=3)
    state = collector.state_dict()
    del state["traj_id_offset"], state["traj_id_stride"]
    collector.load_state_dict(state)
    assert (collector.traj_id_offset, collector.traj_id_stride) == (0, 1)


@pytest.mark.parametrize(
    ("offset", "stride", "match"),
    [
        (0, 0, "traj_id_stride an int >= 1"),
        (-1, 1, "traj_id_offset an int >= 0"),
        (3, 3, r"0 <= traj_id_offset < traj_id_stride.*Fix: traj_id_offset=0"),
        (0, 1.5, "traj_id_stride an int"),
    ],
)
def test_invalid_traj_id_layout(offset, stride, match):
    _lstm, policy = make_policy()
    with pytest.raises(ValueError, match=match):
        Collector(
            CountingEnv(), policy, frames_per_batch=4, traj_id_offset=offset, traj_id_stride=stride
        )


def test_traj_id_offset_with_stride_one_is_a_plain_offset():
    _, _, batches = collect(1, frames_per_batch=12, traj_id_offset=100)
    assert batches[0]["collector", "traj_ids"][:, 0].tolist() == [100, 101, 102]
