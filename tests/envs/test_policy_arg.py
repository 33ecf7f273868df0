"""Tests of the ``policy=`` argument of env constructors (recurrl.envs._policy_arg)."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.envs import (
    EnvBase,
    GymEnv,
    GymVecEnv,
    InitTracker,
    TensorDictPrimer,
    TransformedEnv,
    find_transform,
)
from recurrl.envs._policy_arg import with_policy_transforms
from recurrl.modules import GRUModule, LSTMModule
from recurrl.testing import CountingEnv


def lstm_policy(obs_dim: int = 3) -> Seq:
    lstm = LSTMModule(
        obs_dim, 8, in_keys=["observation", "rs_h", "rs_c"],
        out_keys=["features", ("next", "rs_h"), ("next", "rs_c")],
    )  # fmt: skip
    head = Mod(nn.Linear(8, 2), in_keys=["features"], out_keys=["logits"])
    act = Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"])
    return Seq(lstm, head, act)


def counts(env: EnvBase) -> tuple[int, int]:
    return len(find_transform(env, InitTracker)), len(find_transform(env, TensorDictPrimer))


def test_gym_env_with_a_recurrent_policy_is_a_transformed_env_around_it():
    policy = lstm_policy(obs_dim=4)
    env = GymEnv("CartPole-v1", seed=0, policy=policy)
    assert type(env) is TransformedEnv and type(env.base_env) is GymEnv
    assert counts(env) == (1, 1)
    td = env.reset()
    assert td["is_init"].item() and td["rs_h"].shape == (1, 8)
    assert "rs_h" in env.state_spec and "is_init" in env.observation_spec
    data = env.rollout(4, policy, break_when_any_done=False)
    assert data["is_init"][:, 0].tolist() == [True, False, False, False]
    # the policy's state rides from step to step (not reset to the primer's zeros)
    assert data["rs_h"][1:].abs().sum() > 0
    assert torch.equal(data["rs_h"][1:], data["next", "rs_h"][:-1])
    env.close()


def test_num_envs_and_vector_env_get_the_transforms_at_the_batched_level():
    policy = lstm_policy(obs_dim=4)
    env = GymEnv("CartPole-v1", num_envs=2, policy=policy)
    assert type(env) is TransformedEnv and type(env.base_env) is GymVecEnv
    assert env.batch_size == (2,) and env.vectorization == "sync"  # base attrs reachable
    assert env.reset()["rs_c"].shape == (2, 1, 8)
    env.close()
    direct = GymVecEnv("CartPole-v1", num_envs=2, policy=policy)
    assert type(direct.base_env) is GymVecEnv and counts(direct) == (1, 1)
    direct.close()


def test_every_env_class_takes_policy():
    policy = lstm_policy()
    counting = CountingEnv(batch_size=(2,), policy=policy)
    assert type(counting) is TransformedEnv and type(counting.base_env) is CountingEnv
    # a TransformedEnv is extended in place: same object, transforms appended after its own
    base = TransformedEnv(CountingEnv(), InitTracker())
    wrapped = TransformedEnv(base, policy=policy)
    assert counts(wrapped) == (1, 1)
    tracker_only = TransformedEnv(CountingEnv(), InitTracker(), policy=policy)
    assert type(tracker_only.base_env) is CountingEnv and counts(tracker_only) == (1, 1)


def test_no_recurrent_module_or_none_leaves_the_env_as_built():
    feed_forward = Mod(nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
    assert type(GymEnv("CartPole-v1", policy=feed_forward)) is GymEnv
    assert type(GymEnv("CartPole-v1", policy=None)) is GymEnv
    assert type(CountingEnv(policy=lambda td: td)) is CountingEnv


def test_state_keys_of_every_recurrent_module_and_non_callable_policy():
    gru = GRUModule(3, 4, in_keys=["observation", "g"], out_keys=["y", ("next", "g")])
    lstm = LSTMModule(4, 8, in_keys=["y", "rs_h", "rs_c"],
                      out_keys=["z", ("next", "rs_h"), ("next", "rs_c")])  # fmt: skip
    env = CountingEnv(policy=Seq(gru, lstm))
    assert counts(env) == (1, 1)
    assert sorted(find_transform(env, TensorDictPrimer)[0].out_keys) == ["g", "rs_c", "rs_h"]
    with pytest.raises(TypeError, match=r"CountingEnv\(policy=\.\.\.\).*received int"):
        CountingEnv(policy=3)


def test_collector_on_such_an_env_adds_nothing():
    policy = lstm_policy(obs_dim=4)
    env = GymEnv("CartPole-v1", seed=0, policy=policy)
    collector = Collector(env, policy, frames_per_batch=8, total_frames=16)
    assert collector.env is env and counts(env) == (1, 1)
    strict = Collector(env, policy, frames_per_batch=8, auto_register_policy_transforms=False)
    assert strict.env is env
    data = next(iter(collector))
    assert data["is_init"][0].item() and data["rs_h"].shape == (8, 1, 8)
    # the same env given twice, and the helper called on an already wired env: still once
    assert with_policy_transforms(env, policy) is env and counts(env) == (1, 1)
    collector.shutdown()


def test_factory_building_the_env_with_policy():
    policy = lstm_policy()
    collector = Collector(
        lambda: CountingEnv(batch_size=(2,), max_steps=3, policy=policy),
        policy,
        frames_per_batch=8,
    )
    assert counts(collector.env) == (1, 1)
    assert next(iter(collector))["is_init"][:, 3].all()  # episodes of 3 steps
