"""StepPlan (env.step_and_maybe_reset, the collector's loop) against the public path.

Two copies of the same env are driven with the same actions: one through ``env.step``,
``env.step_mdp`` and ``env.reset`` of the finished envs (the oracle), the other through the
plan. Every step's TensorDict and every next root must be identical, over random transform
sets (with and without fused forms), episode lengths, batch shapes and policy-written keys.
"""

from __future__ import annotations

import random

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from recurrl.envs import EnvBase, GymEnv, GymVecEnv, TransformedEnv
from recurrl.envs._step_plan import StepPlan
from recurrl.envs.common import _FULL_CHECKS
from recurrl.envs.specs import Unbounded
from recurrl.envs.transforms import (
    Compose,
    InitTracker,
    RewardSum,
    StepCounter,
    TensorDictPrimer,
)
from recurrl.envs.utils import RESET_KEY, get_reset_mask
from recurrl.testing import CountingEnv


def assert_identical(actual: TensorDictBase, expected: TensorDictBase) -> None:
    """Same nested keys and batch sizes; leaves equal bit for bit with the same dtype."""
    assert actual.batch_size == expected.batch_size
    assert sorted(map(str, actual.keys(True))) == sorted(map(str, expected.keys(True)))
    for key in actual.keys(True, True):
        a, e = actual.get(key), expected.get(key)
        assert a.dtype == e.dtype and a.shape == e.shape, key
        assert torch.equal(a, e), key


class LazyResetEnv(CountingEnv):
    """Returns -7 for the envs a partial reset leaves alone (the env contract lets it: the
    caller keeps their current values), so a missing merge shows."""

    def _reset(self, tensordict, **kwargs):
        out = super()._reset(tensordict, **kwargs)
        mask = get_reset_mask(tensordict, self.batch_size)
        if mask is not None:
            obs = out.get("observation")
            out.set("observation", torch.where(mask.unsqueeze(-1), obs, -7.0))
        return out


def _oracle(env: EnvBase, td: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
    td = env.step(td)
    root = env.step_mdp(td)
    done = td.get(("next", "done")).reshape(*env.batch_size, -1).any(-1)  # independent of the plan
    if bool(done.any()):
        root.set(RESET_KEY, done.unsqueeze(-1))
        out = env.reset(root)
        del root[RESET_KEY]
        root.update(out)
    return td, root


def _transforms(rng: random.Random) -> list:
    primer = TensorDictPrimer(
        {"rs_h": Unbounded(shape=(3,)), "rs_c": Unbounded(shape=(2, 3))},
        default_value=rng.choice([0.0, 1.5]),
    )
    pool = [InitTracker(), primer]
    if rng.random() < 0.4:
        pool.append(rng.choice([StepCounter(), RewardSum()]))  # no fused form
    rng.shuffle(pool)
    return pool


def _policy(rng: random.Random, writes_next: bool):
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))

    def policy(td: TensorDictBase) -> TensorDictBase:
        batch = td.batch_size
        td.set("action", torch.randint(0, 2, batch, generator=gen))
        if writes_next:
            h = td.get("rs_h")
            td.set(("next", "rs_h"), h + torch.rand(h.shape, generator=gen))
        return td

    return policy


def _pair(make, rng: random.Random) -> tuple[TransformedEnv, TransformedEnv]:
    transforms = _transforms(rng)
    composed = rng.random() < 0.5
    envs = []
    for _ in range(2):
        t = [x.clone() for x in transforms]
        if composed:  # one Compose holding them all
            envs.append(TransformedEnv(make(), Compose(*t)))
        else:  # appended one by one
            env = TransformedEnv(make(), t[0])
            for extra in t[1:]:
                env.append_transform(extra)
            envs.append(env)
    return envs[0], envs[1]


@pytest.mark.parametrize("case", range(24))
def test_plan_matches_public_path_counting_env(case: int) -> None:
    rng = random.Random(case)
    batch = rng.choice([(), (1,), (3,), (2, 2)])
    size = 1
    for d in batch:
        size *= d
    lengths = [rng.randint(1, 5) for _ in range(size)]
    max_steps = lengths[0] if not batch else torch.tensor(lengths).reshape(batch).tolist()

    env_class = rng.choice([CountingEnv, LazyResetEnv])

    def make() -> CountingEnv:
        return env_class(batch_size=batch, max_steps=max_steps)

    env_a, env_b = _pair(make, rng)
    writes_next = rng.random() < 0.5
    policy_a, policy_b = (
        _policy(random.Random(case), writes_next),
        _policy(random.Random(case), writes_next),
    )
    root_a, root_b = env_a.reset(), env_b.reset()
    plan = env_b._step_plan()
    for _ in range(30):
        td_a, root_a = _oracle(env_a, policy_a(root_a))
        td_b, root_b = plan(policy_b(root_b))
        assert_identical(td_b, td_a)
        assert_identical(root_b, root_a)
    assert plan.planned


@pytest.mark.parametrize("num_envs", [1, 4])
def test_plan_matches_public_path_gym(num_envs: int) -> None:
    pytest.importorskip("gymnasium")
    rng = random.Random(num_envs)

    def make() -> EnvBase:
        env = (
            GymEnv("CartPole-v1") if num_envs == 1 else GymVecEnv("CartPole-v1", num_envs=num_envs)
        )
        env.set_seed(3)
        return env

    env_a, env_b = _pair(make, rng)
    policy_a, policy_b = _policy(random.Random(0), True), _policy(random.Random(0), True)
    root_a, root_b = env_a.reset(), env_b.reset()
    resets = 0
    for _ in range(300):
        td_a, root_a = _oracle(env_a, policy_a(root_a))
        td_b, root_b = env_b.step_and_maybe_reset(policy_b(root_b))
        resets += int(td_a["next", "done"].any())
        assert_identical(td_b, td_a)
        assert_identical(root_b, root_a)
    assert resets > 5


def test_fused_forms_are_used_and_agree_with_hooks() -> None:
    """With only fused transforms the plan calls neither _step nor _reset of them."""
    env = TransformedEnv(CountingEnv(batch_size=(3,), max_steps=[1, 2, 3]), InitTracker())
    env.append_transform(TensorDictPrimer({"rs_h": Unbounded(shape=(3,))}))
    plan = env._step_plan()
    assert plan.fused is not None and len(plan.fused) == 2
    calls = []
    for t in plan.fused:
        for name in ("_step", "_reset"):
            original = getattr(t, name)

            def spy(*args, _original=original, _name=name):
                calls.append(_name)
                return _original(*args)

            setattr(t, name, spy)
    root = env.reset()
    for _ in range(10):
        _, root = plan(env.rand_action(root))
    # Only the first calls of each kind (env.reset() included) take the public path, which
    # validates them in full; every later step and partial reset is fused.
    assert calls.count("_step") == 2 * _FULL_CHECKS
    assert calls.count("_reset") == 2 * _FULL_CHECKS


def test_subclass_does_not_inherit_fused_forms() -> None:
    class Tracker(InitTracker):
        def _step(self, tensordict, next_tensordict):
            next_tensordict = super()._step(tensordict, next_tensordict)
            next_tensordict.set("seen", torch.ones(*next_tensordict.batch_size, 1))
            return next_tensordict

    env = TransformedEnv(CountingEnv(batch_size=(2,), max_steps=2), Tracker())
    assert env._step_plan().fused is None
    root = env.reset()
    for _ in range(6):
        td, root = env.step_and_maybe_reset(env.rand_action(root))
        assert "seen" in td["next"]


def test_plan_not_used_for_nested_transformed_env() -> None:
    inner = TransformedEnv(CountingEnv(batch_size=(2,), max_steps=2), InitTracker())
    env = TransformedEnv(inner, StepCounter())
    plan = env._step_plan()
    assert not plan.planned
    root = env.reset()
    for _ in range(5):
        _td, root = plan(env.rand_action(root))
    assert root["step_count"].shape == (2, 1)


def test_plan_errors_are_the_public_ones() -> None:
    env = TransformedEnv(CountingEnv(batch_size=(2,), max_steps=3), InitTracker())
    plan = env._step_plan()
    root = env.reset()
    for _ in range(4):
        _, root = plan(env.rand_action(root))
    with pytest.raises(KeyError, match="expected an action"):
        plan.step(root.copy())
    with pytest.raises(ValueError, match="batch_size"):
        plan.step(TensorDict({"action": torch.zeros(3, dtype=torch.int64)}, [3]))


def test_plan_is_rebuilt_when_transforms_change() -> None:
    env = TransformedEnv(CountingEnv(batch_size=(2,), max_steps=2), InitTracker())
    first = env._step_plan()
    assert env._step_plan() is first
    env.append_transform(StepCounter())
    second = env._step_plan()
    assert second is not first and second.fused is None
    assert isinstance(second, StepPlan)


@pytest.mark.parametrize("case", range(16))
def test_planned_partial_reset_matches_the_public_reset(case: int) -> None:
    """``plan.reset`` on random roots (plain, with dim names, with extra entries and a
    nested one, a given or omitted count) and masks equals ``root["_reset"] = done;
    root.update(env.reset(root))`` on the twin env, and leaves no ``"_reset"`` behind."""
    rng = random.Random(case)
    batch = rng.choice([(1,), (3,), (5,)])
    lengths = [rng.randint(1, 4) for _ in range(batch[0])]
    env_a, env_b = _pair(lambda: LazyResetEnv(batch_size=batch, max_steps=lengths), rng)
    plan = env_b._step_plan()
    root_a, root_b = env_a.reset(), env_b.reset()
    policy_a, policy_b = _policy(random.Random(case), False), _policy(random.Random(case), False)
    for _ in range(2 * _FULL_CHECKS):  # past the checked first calls: the planned path
        _, root_a = _oracle(env_a, policy_a(root_a))
        _, root_b = plan(policy_b(root_b))
    for _ in range(6):
        done = torch.rand(batch) < rng.random()
        extra = torch.randn(*batch, 2)
        a, b = root_a.clone(), root_b.clone()
        nested = rng.random() < 0.3
        for root in (a, b):
            root.set("extra", extra.clone())
            if nested:
                root.set(("nested", "x"), extra.clone())
        if rng.random() < 0.3:
            a.names, b.names = ["env"], ["env"]
        if bool(done.any()):
            a.set(RESET_KEY, done.unsqueeze(-1))
            out = env_a.reset(a)
            del a[RESET_KEY]
            a.update(out)
        count = int(done.sum()) if rng.random() < 0.5 else None
        b = plan.reset(b, done, count)
        assert RESET_KEY not in b
        assert b.names == a.names
        assert_identical(b, a)
        root_a, root_b = a.exclude("extra", "nested"), b.exclude("extra", "nested")
        root_a.names, root_b.names = None, None
    assert plan.planned
