"""Tests of recurrl.envs.common.EnvBase (on the fake envs of recurrl.testing)."""

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import Categorical, Composite, EnvBase, TransformedEnv, Unbounded
from recurrl.envs.transforms import InitTracker
from recurrl.testing import CountingEnv


class BrokenEnv(EnvBase):
    """An env whose _step output is configurable, to test validation."""

    def __init__(self, next_content):
        super().__init__()
        self.next_content = next_content
        self.observation_spec = Composite(observation=Unbounded(2))
        self.action_spec = Categorical(2)

    def _reset(self, tensordict, **kwargs):
        return TensorDict({"observation": torch.zeros(2)}, batch_size=[])

    def _step(self, tensordict):
        return TensorDict(self.next_content(), batch_size=[])

    def _set_seed(self, seed):
        pass


def good_next():
    flag = torch.zeros(1, dtype=torch.bool)
    return {"observation": torch.ones(2), "reward": torch.ones(1), "terminated": flag}


class TestReset:
    def test_single(self):
        td = CountingEnv().reset()
        assert td.batch_size == ()
        assert td["observation"].shape == (3,)
        for key in ("done", "terminated", "truncated"):
            assert td[key].shape == (1,) and td[key].dtype == torch.bool
            assert not td[key].any()

    def test_batched(self):
        td = CountingEnv(batch_size=(4,)).reset()
        assert td.batch_size == (4,) and td["observation"].shape == (4, 3)
        assert td["done"].shape == (4, 1)

    @pytest.mark.parametrize("mask_shape", [(3, 1), (3,)])
    def test_partial_reset_keeps_others(self, mask_shape):
        env = CountingEnv(batch_size=(3,), max_steps=10)
        td = env.reset()
        for _ in range(2):
            td = env.step_mdp(env.step(env.rand_action(td)))
        td["done"] = torch.tensor([[True], [False], [True]])
        td["_reset"] = torch.tensor([True, False, False]).reshape(mask_shape)
        out = env.reset(td)
        assert out["observation"][:, 0].tolist() == [0.0, 2.0, 2.0]
        assert out["done"].squeeze(-1).tolist() == [False, False, True]
        assert env.count.tolist() == [0, 2, 2]
        assert "_reset" not in out
        assert "_reset" in td  # the input is not modified

    def test_partial_reset_nothing_selected(self):
        env = CountingEnv(batch_size=(2,), max_steps=10)
        td = env.step_mdp(env.step(env.rand_action(env.reset())))
        td["_reset"] = torch.zeros(2, 1, dtype=torch.bool)
        out = env.reset(td)
        assert out["observation"][:, 0].tolist() == [1.0, 1.0]
        assert env.count.tolist() == [1, 1]

    def test_bad_inputs(self):
        env = CountingEnv(batch_size=(2,))
        with pytest.raises(ValueError, match=r"batch_size \(2,\)"):
            env.reset(TensorDict({}, batch_size=[3]))
        with pytest.raises(TypeError, match="expected a TensorDict"):
            env.reset({"a": 1})
        bad = TensorDict({"_reset": torch.ones(2, 3, dtype=torch.bool)}, batch_size=[2])
        with pytest.raises(ValueError, match="reset mask"):
            env.reset(bad)


class TestStep:
    def test_writes_next_and_returns_same_td(self):
        env = CountingEnv(batch_size=(2,))
        td = env.rand_action(env.reset())
        out = env.step(td)
        assert out is td
        nxt = td["next"]
        assert nxt["observation"][:, 0].tolist() == [1.0, 1.0]
        assert nxt["reward"].shape == (2, 1) and nxt["reward"].dtype == torch.float32
        assert torch.equal(nxt["done"], nxt["terminated"] | nxt["truncated"])

    def test_keeps_policy_next_keys(self):
        env = CountingEnv()
        td = env.rand_action(env.reset())
        td["next", "rs_h"] = torch.ones(2)
        td["next", "observation"] = torch.full((3,), -1.0)  # env output wins
        env.step(td)
        assert torch.equal(td["next", "rs_h"], torch.ones(2))
        assert td["next", "observation"][0] == 1.0

    def test_missing_action(self):
        env = CountingEnv()
        with pytest.raises(KeyError, match="expected an action under 'action'"):
            env.step(env.reset())

    def test_done_filled_and_checked(self):
        env = BrokenEnv(good_next)
        td = env.step(env.rand_action(env.reset()))
        assert not td["next", "done"].any() and not td["next", "truncated"].any()

        def inconsistent():
            return {**good_next(), "done": torch.ones(1, dtype=torch.bool)}

        env = BrokenEnv(inconsistent)
        with pytest.raises(ValueError, match=r"'done' must equal terminated \| truncated"):
            env.step(env.rand_action(env.reset()))

    def test_missing_key_named(self):
        env = BrokenEnv(lambda: {k: v for k, v in good_next().items() if k != "observation"})
        with pytest.raises(KeyError, match="did not write 'observation'"):
            env.step(env.rand_action(env.reset()))
        env = BrokenEnv(lambda: {k: v for k, v in good_next().items() if k != "reward"})
        with pytest.raises(KeyError, match="did not write 'reward'"):
            env.step(env.rand_action(env.reset()))

    def test_wrong_shape_named(self):
        env = BrokenEnv(lambda: {**good_next(), "observation": torch.ones(3)})
        with pytest.raises(ValueError, match=r"key 'observation' has shape \(3,\)"):
            env.step(env.rand_action(env.reset()))


class TestStepMDP:
    def test_carries_only_spec_keys(self):
        env = CountingEnv()
        td = env.step(env.rand_action(env.reset()))
        td["next", "foo"] = torch.ones(1)
        td["logits"] = torch.ones(2)
        out = env.step_mdp(td)
        assert "foo" not in out
        assert "reward" not in out and "action" not in out
        assert out["observation"][0] == 1.0
        assert {"done", "terminated", "truncated"} <= set(out.keys())
        assert "logits" in out  # other root keys are kept

    def test_primer_like_state_key_is_carried(self):
        class StateEnv(CountingEnv):
            def __init__(self):
                super().__init__()
                self.state_spec = Composite(h=Unbounded(2))

            def _reset(self, tensordict, **kwargs):
                return super()._reset(tensordict).set("h", torch.zeros(2))

        env = StateEnv()
        td = env.rand_action(env.reset())
        env.step(td)
        td["next", "h"] = torch.ones(2)
        assert torch.equal(env.step_mdp(td)["h"], torch.ones(2))


class TestRollout:
    def test_single(self):
        env = CountingEnv(max_steps=4)
        data = env.rollout(10)
        assert data.batch_size == (4,)
        assert data["observation"][:, 0].tolist() == [0, 1, 2, 3]
        assert data["next", "done"].squeeze(-1).tolist() == [False, False, False, True]
        assert "_reset" not in data.keys(include_nested=True)

    def test_max_steps(self):
        assert CountingEnv(max_steps=10).rollout(3).batch_size == (3,)

    def test_batched_time_is_last(self):
        env = CountingEnv(batch_size=(2,), max_steps=[3, 5])
        data = env.rollout(10)
        assert data.batch_size == (2, 3)
        assert data["next", "observation"].shape == (2, 3, 3)
        assert data["action"].shape == (2, 3)

    def test_multi_dim_batch(self):
        data = CountingEnv(batch_size=(2, 3), max_steps=4).rollout(10)
        assert data.batch_size == (2, 3, 4)

    def test_no_break_partial_resets(self):
        env = CountingEnv(batch_size=(3,), max_steps=[2, 3, 10])
        data = env.rollout(6, break_when_any_done=False)
        assert data.batch_size == (3, 6)
        assert data["observation"][..., 0].tolist() == [
            [0, 1, 0, 1, 0, 1],
            [0, 1, 2, 0, 1, 2],
            [0, 1, 2, 3, 4, 5],
        ]
        assert not data["done"][:, 0].any()
        assert "_reset" not in data.keys(include_nested=True)

    def test_single_env_no_break_resets(self):
        data = CountingEnv(max_steps=2).rollout(5, break_when_any_done=False)
        assert data["observation"][:, 0].tolist() == [0, 1, 0, 1, 0]

    def test_break_when_all_done(self):
        env = CountingEnv(batch_size=(2,), max_steps=[1, 3])
        data = env.rollout(10, break_when_any_done=False, break_when_all_done=True)
        assert data.batch_size == (2, 3)  # env 0 finishes at t=0 and t=2, env 1 at t=2

    def test_policy_and_callback(self):
        env = CountingEnv(batch_size=(2,))
        calls = []

        def policy(td):
            td["action"] = torch.ones(2, dtype=torch.int64)
            td["logits"] = torch.zeros(2, 2)

        data = env.rollout(3, policy, callback=lambda e, td: calls.append(td))
        assert len(calls) == 3
        assert (data["action"] == 1).all() and data["logits"].shape == (2, 3, 2)

    def test_undeclared_next_key_does_not_ride_along(self):
        env = CountingEnv(max_steps=10)
        seen = []

        def policy(td):
            seen.append("rs_h" in td)
            td["next", "rs_h"] = torch.ones(1)
            return env.rand_action(td)

        data = env.rollout(4, policy)
        assert seen == [False] * 4
        assert "rs_h" not in data

    def test_recurrent_policy_without_primer_fails_loudly(self):
        env = CountingEnv(max_steps=10)

        def policy(td):  # what a recurrent module does when its state key is missing
            td.get("rs_h", None)
            if "rs_h" not in td and "is_init" not in td:
                raise KeyError("'rs_h' missing: add the module's primer to the env")
            return env.rand_action(td)

        with pytest.raises(KeyError, match="rs_h"):
            env.rollout(3, policy)

    def test_auto_reset_false(self):
        env = CountingEnv(max_steps=5)
        with pytest.raises(ValueError, match=r"tensordict=env\.reset"):
            env.rollout(3, auto_reset=False)
        start = env.reset()
        env.step(env.rand_action(start))  # internal count is now 1
        data = env.rollout(2, auto_reset=False, tensordict=env.step_mdp(start))
        assert data["observation"][:, 0].tolist() == [1, 2]

    def test_set_truncated(self):
        data = CountingEnv(max_steps=10).rollout(3, set_truncated=True)
        assert data["next", "truncated"].squeeze(-1).tolist() == [False, False, True]
        assert data["next", "done"][-1].all() and not data["next", "terminated"].any()

    def test_bad_args(self):
        with pytest.raises(ValueError, match="max_steps >= 1"):
            CountingEnv().rollout(0)
        with pytest.raises(TypeError, match="must return a TensorDict"):
            CountingEnv().rollout(2, lambda td: 3)

    def test_key_mismatch_error(self):
        counter = iter(range(10))

        def policy(td):
            if next(counter) == 1:
                td["extra"] = torch.zeros(())
            return CountingEnv().rand_action(td)

        with pytest.raises(RuntimeError, match="same keys at every step"):
            CountingEnv(max_steps=10).rollout(3, policy)


class TestSpecsAndMisc:
    def test_default_specs(self):
        env = CountingEnv(batch_size=(2,))
        assert env.reward_spec == Unbounded((2, 1))
        assert set(env.done_spec.keys()) == {"done", "terminated", "truncated"}
        assert env.full_done_spec is env.done_spec
        assert env.state_spec.is_empty()
        assert env.full_action_spec["action"] is env.action_spec
        assert env.done_keys == ["done", "terminated", "truncated"]
        assert env.observation_keys == ["observation"] and env.reward_keys == ["reward"]
        assert env.action_keys == ["action"] and env.state_keys == []

    def test_spec_setters_validate(self):
        env = CountingEnv(batch_size=(2,))
        with pytest.raises(TypeError, match="expected a Composite"):
            env.observation_spec = Unbounded((2, 3))
        with pytest.raises(ValueError, match=r"expected a Composite of shape \(2,\)"):
            env.observation_spec = Composite(observation=Unbounded(3))
        with pytest.raises(ValueError, match="starting with"):
            env.action_spec = Categorical(2)  # missing the batch dim

    def test_missing_action_spec(self):
        class NoAction(EnvBase):
            def _reset(self, td, **kw):
                return TensorDict({}, batch_size=[])

            def _step(self, td):
                return TensorDict({}, batch_size=[])

            def _set_seed(self, seed):
                pass

        with pytest.raises(RuntimeError, match=r"must set self\.action_spec"):
            NoAction().action_spec  # noqa: B018

    def test_abstract(self):
        with pytest.raises(TypeError):
            EnvBase()

    def test_rand_action_and_fake_tensordict(self):
        env = CountingEnv(batch_size=(2,))
        assert env.rand_action()["action"].shape == (2,)
        fake = env.fake_tensordict()
        assert fake.batch_size == (2,)
        assert {"observation", "action", "done", ("next", "reward")} <= set(
            fake.keys(include_nested=True)
        )

    def test_misc(self):
        env = CountingEnv()
        assert env.set_seed(3) == 3
        assert env.batch_locked
        assert isinstance(env.append_transform(InitTracker()), TransformedEnv)
        with pytest.raises(NotImplementedError, match=r"env\.step"):
            env(TensorDict({}, batch_size=[]))
        assert env.to("cpu") is env  # the reference's EnvBase.to (see TestTo)
        env.close()
        env.close()
        assert env.is_closed
        assert "batch_size=()" in repr(env)


class TestDoneSpecLeaf:
    def test_leaf_means_done_and_fills_the_others(self):
        env = CountingEnv(batch_size=(3,), max_steps=2)
        leaf = Categorical(2, shape=(3, 1), dtype=torch.bool)
        env.done_spec = leaf
        assert isinstance(env.done_spec, Composite)
        assert env.done_keys == ["done", "terminated", "truncated"]
        assert all(env.done_spec[k] == leaf for k in env.done_keys)
        data = env.rollout(2)
        assert data["next", "done"][:, -1].all() and not data["next", "truncated"].any()

    def test_leaf_must_hold_the_batch_dims(self):
        env = CountingEnv(batch_size=(3,))
        with pytest.raises(ValueError, match="expected a shape starting with"):
            env.done_spec = Categorical(2, shape=(1,), dtype=torch.bool)
