"""The batched-env contract, run on SerialEnv and ParallelEnv alike (recurrl.envs.batched).

Each test builds its env through the ``batched`` fixture, parametrized over both classes,
and the reference is ``GymEnv(id, num_envs=N)`` (gymnasium's own vector env) or exact
counts of ``CountingEnv``. ParallelEnv's process handling is in ``test_parallel.py``.
"""

from __future__ import annotations

import functools

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.envs import (
    Compose,
    EnvCreator,
    GymEnv,
    InitTracker,
    ParallelEnv,
    SerialEnv,
    Transform,
    TransformedEnv,
    check_env_specs,
)
from recurrl.modules import LSTMModule
from recurrl.testing import CountingEnv


@pytest.fixture(params=["serial", "parallel"])
def batched(request):
    """``batched(num_workers, fn, **kw)``: the env class under test, closed at teardown."""
    made = []

    def make(*args, **kwargs):
        if request.param == "parallel":
            kwargs.setdefault("step_timeout", 60)
            env = ParallelEnv(*args, **kwargs)
        else:
            env = SerialEnv(*args, **kwargs)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def cartpole():
    return GymEnv("CartPole-v1")


def random_rollout(env, seed, steps=60):
    env.set_seed(seed)
    torch.manual_seed(seed)
    return env.rollout(steps, break_when_any_done=False)


def test_specs_are_the_sub_env_specs_expanded(batched):
    env = batched(2, cartpole)
    assert env.batch_size == torch.Size([2])
    assert env.observation_spec["observation"].shape == (2, 4)
    assert env.action_spec.shape == (2,) and env.action_spec.n == 2
    assert env.reward_spec.shape == (2, 1)
    assert {k: s.shape for k, s in env.done_spec.items()} == {
        k: (2, 1) for k in ("done", "terminated", "truncated")
    }
    check_env_specs(env)


def test_rollouts_equal_gymnasium_vector_env_with_seed_plus_i(batched):
    # The reference: gymnasium's vector env, also seeding sub-env i with seed + i.
    env = batched(2, cartpole)
    data = random_rollout(env, 3)
    reference = random_rollout(GymEnv("CartPole-v1", num_envs=2), 3)
    assert data["next", "done"].any()  # episodes ended and were partially reset
    assert (data == reference).all()
    assert (random_rollout(env, 3) == data).all()  # reproducible
    assert not (random_rollout(env, 4) == data).all()


def test_partial_reset_resets_only_the_masked_sub_envs(batched):
    env = batched(2, [functools.partial(CountingEnv, max_steps=m) for m in (2, 3)])
    td = env.reset()
    for _ in range(2):
        td = env.step_mdp(env.step(env.rand_action(td)))
    assert td["done"].squeeze(-1).tolist() == [True, False]
    with pytest.raises(RuntimeError, match=r"sub-env\(s\) \[0\] finished"):
        env.step(env.rand_action(td.clone()))
    td["_reset"] = td["done"].clone()
    out = env.reset(td)
    assert "_reset" not in out
    assert out["observation"][:, 0].tolist() == [0.0, 2.0]  # sub-env 1 keeps its input
    assert out["done"].squeeze(-1).tolist() == [False, False]
    data = env.rollout(6, break_when_any_done=False)  # rollout resets finished envs itself
    assert data["next", "observation"][..., 0].tolist() == [
        [1, 2, 1, 2, 1, 2],
        [1, 2, 3, 1, 2, 3],
    ]


def test_batched_or_differing_sub_envs_are_refused(batched):
    with pytest.raises(ValueError, match=r"unbatched sub-envs.*batch_size \[3\]"):
        batched(2, functools.partial(CountingEnv, batch_size=(3,)))
    fns = [functools.partial(CountingEnv, obs_dim=d) for d in (3, 4)]
    with pytest.raises(ValueError, match=r"sub-env 1 differs from sub-env 0.*observation_spec"):
        batched(2, fns)
    with pytest.raises(ValueError, match="one callable per worker"):
        batched(3, fns)
    with pytest.raises(TypeError, match="not an env"):
        batched(2, CountingEnv())
    with pytest.raises(ValueError, match="num_workers an int >= 1"):
        batched(0, CountingEnv)


def test_create_env_kwargs_one_dict_or_one_per_worker(batched):
    env = batched(2, CountingEnv, create_env_kwargs=[{"max_steps": 1}, {"max_steps": 2}])
    assert env.rollout(5, break_when_any_done=False)["next", "done"][..., 0].tolist() == [
        [True] * 5,
        [False, True, False, True, False],
    ]
    env = batched(2, EnvCreator(CountingEnv), create_env_kwargs={"obs_dim": 2})
    assert env.observation_spec["observation"].shape == (2, 2)


def lstm_policy(hidden=8):
    torch.manual_seed(0)
    lstm = LSTMModule(
        4, hidden, in_keys=["observation", "rs_h", "rs_c"],
        out_keys=["features", ("next", "rs_h"), ("next", "rs_c")],
    )  # fmt: skip
    head = Mod(nn.Linear(hidden, 2), in_keys=["features"], out_keys=["logits"])
    act = Mod(lambda x: x.argmax(-1), in_keys=["logits"], out_keys=["action"])
    return Seq(lstm, head, act), lstm


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_recurrent_transforms_inside_or_outside_the_batch(batched, where):
    policy, lstm = lstm_policy()

    def wired():  # InitTracker and the LSTM's primers, per sub-env
        return TransformedEnv(cartpole(), Compose(InitTracker(), lstm.make_tensordict_primer()))

    if where == "inside":
        env = batched(2, wired)
    else:
        env = TransformedEnv(
            batched(2, cartpole), Compose(InitTracker(), lstm.make_tensordict_primer())
        )
    reference = TransformedEnv(
        GymEnv("CartPole-v1", num_envs=2), Compose(InitTracker(), lstm.make_tensordict_primer())
    )
    assert env.state_spec == reference.state_spec
    env.set_seed(0)
    reference.set_seed(0)
    data = env.rollout(80, policy, break_when_any_done=False)
    expected = reference.rollout(80, policy, break_when_any_done=False)
    assert data["next", "done"].any() and data["is_init"][:, 1:].any()
    assert (data["next", "rs_h"] != 0).any()  # the policy's state rode through the batch
    assert (data == expected).all()


def test_collector_with_a_recurrent_policy_matches_gymnasium(batched):
    policy, _ = lstm_policy()

    def collect(env):
        env.set_seed(1)
        collector = Collector(env, policy, frames_per_batch=60, total_frames=120)
        batches = list(collector)
        collector.shutdown()
        return torch.cat(batches, 1)

    data = collect(batched(2, cartpole))  # the collector appends InitTracker and the primer
    expected = collect(GymEnv("CartPole-v1", num_envs=2))
    assert data.batch_size == (2, 60) and data["next", "done"].any()
    assert {"is_init", "rs_h", "rs_c"} <= set(data.keys())
    assert (data == expected).all()


class CountSteps(Transform):
    """Counts the steps it saw in a buffer (so the env's state_dict holds something)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def _step(self, tensordict, next_tensordict):
        self.steps += 1
        return next_tensordict


def test_state_dict_holds_each_sub_env_under_its_index(batched):
    env = batched(2, lambda: TransformedEnv(CountingEnv(), CountSteps()))
    env.rollout(3)
    state = env.state_dict()
    assert {k: v.item() for k, v in state.items()} == {
        "envs.0.transform.transforms.0.steps": 3,
        "envs.1.transform.transforms.0.steps": 3,
    }
    fresh = batched(2, lambda: TransformedEnv(CountingEnv(), CountSteps()))
    state["envs.1.transform.transforms.0.steps"] = torch.tensor(7)
    fresh.load_state_dict(state)
    assert fresh.state_dict()["envs.1.transform.transforms.0.steps"].item() == 7
    with pytest.raises(RuntimeError, match=r"Unexpected key.*stray"):
        fresh.load_state_dict({**state, "stray": torch.zeros(())})
    with pytest.raises(RuntimeError, match=r"Missing key.*envs\.1\.transform"):
        fresh.load_state_dict({k: v for k, v in state.items() if k.startswith("envs.0.")})
    assert fresh.rollout(2).batch_size == (2, 2)  # a mismatch leaves the env usable


def test_close_is_idempotent(batched):
    env = batched(2, CountingEnv)
    env.close()
    env.close()
    assert env.is_closed
