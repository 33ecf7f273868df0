"""Tests of recurrl.envs.transforms.TensorDictPrimer."""

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import (
    Bounded,
    Categorical,
    Composite,
    InitTracker,
    TensorDictPrimer,
    TransformedEnv,
    Unbounded,
    find_transform,
)
from recurrl.testing import CountingEnv


def make_env(primer, batch_size=(), max_steps=5):
    return TransformedEnv(CountingEnv(batch_size, max_steps=max_steps), primer)


def lstm_primer(**kwargs):
    return TensorDictPrimer(rs_h=Unbounded((1, 4)), rs_c=Unbounded((1, 4)), **kwargs)


class TestConstruction:
    def test_dict_kwargs_composite(self):
        a = TensorDictPrimer({"rs_h": Unbounded(2)})
        b = TensorDictPrimer(rs_h=Unbounded(2))
        c = TensorDictPrimer(Composite(rs_h=Unbounded(2)))
        assert a.primers == b.primers == c.primers
        assert a.out_keys == a.in_keys == ["rs_h"]
        d = TensorDictPrimer({"a": Unbounded(2)}, b=Unbounded(3))
        assert d.out_keys == ["a", "b"]

    def test_repr_shows_keys(self):
        assert repr(lstm_primer()) == "TensorDictPrimer(keys=['rs_h', 'rs_c'], default_value=0.0)"
        assert "random=True" in repr(lstm_primer(random=True))

    def test_errors(self):
        with pytest.raises(ValueError, match="at least one primer"):
            TensorDictPrimer()
        with pytest.raises(TypeError, match="TensorSpec \\(or a Composite of them\\) for key 'h'"):
            TensorDictPrimer(h=torch.zeros(2))
        with pytest.raises(TypeError, match="dict or Composite"):
            TensorDictPrimer([Unbounded(2)])
        with pytest.raises(ValueError, match="exclusive"):
            lstm_primer(random=True, default_value=1.0)
        with pytest.raises(ValueError, match="missing \\['rs_c'\\]"):
            lstm_primer(default_value={"rs_h": 1.0})
        with pytest.raises(ValueError, match="given twice"):
            TensorDictPrimer({"h": Unbounded(2)}, h=Unbounded(2))


class TestReferenceArguments:
    """Primers as the reference's users write them (ported from its TensorDictPrimer tests)."""

    @pytest.mark.parametrize("default_value", [None, 0, 0.0])
    def test_random_with_the_default_fill(self, default_value):
        # the reference accepts random=True with a falsy default_value: random draws
        torch.manual_seed(0)
        primer = TensorDictPrimer(random=True, default_value=default_value, h=Bounded(-3, 3, [4]))
        td = make_env(primer, batch_size=(2,)).reset()
        assert td["h"].shape == (2, 4) and bool((td["h"] != 0).all())
        assert bool(((td["h"] >= -3) & (td["h"] <= 3)).all())

    @pytest.mark.parametrize("default_value", [1.0, lambda: torch.ones(4), {"h": 2.0}])
    def test_random_with_a_value_is_refused(self, default_value):
        with pytest.raises(ValueError, match="exclusive"):
            TensorDictPrimer(random=True, default_value=default_value, h=Unbounded(4))

    def test_random_draws_again_at_each_reset_of_the_reset_envs_only(self):
        torch.manual_seed(0)
        env = make_env(TensorDictPrimer(random=True, h=Unbounded(3)), batch_size=(2,))
        td = env.reset()
        first = td["h"].clone()
        td["_reset"] = torch.tensor([[True], [False]])
        again = env.reset(td)["h"]
        assert not torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])

    @pytest.mark.parametrize("random", [True, False])
    def test_composite_value_becomes_nested_keys(self, random):
        primer = TensorDictPrimer(
            random=random, default_value=0.0 if random else 1.0,
            a=Bounded(-3, 3, [4]), nested=Composite(b=Bounded(-3, 3, [4])),
        )  # fmt: skip
        assert primer.out_keys == ["a", ("nested", "b")]
        env = make_env(primer, batch_size=(2,))
        td = env.reset()
        assert td["nested", "b"].shape == (2, 4)
        if random:
            assert bool((td["nested", "b"] != 1.0).any())
        else:
            assert bool((td["nested", "b"] == 1.0).all())
        assert ("next", "nested", "b") in env.rollout(3).keys(True)

    def test_dict_value_becomes_nested_keys(self):
        primer = TensorDictPrimer({"outer": {"inner": Unbounded(2)}})
        assert primer.out_keys == [("outer", "inner")]

    @pytest.mark.parametrize("expand_specs", [True, None])
    def test_composite_with_the_batch_shape_is_not_expanded_again(self, expand_specs):
        # the reference: a primer Composite of the env's batch shape holds batched leaves
        # (recurrl used to expand it a second time with expand_specs=True: [2, 2, 4])
        primer = TensorDictPrimer(
            Composite(k=Unbounded((2, 4)), shape=(2,)), expand_specs=expand_specs
        )
        env = make_env(primer, batch_size=(2,))
        assert env.observation_spec["k"].shape == (2, 4)
        assert env.reset()["k"].shape == (2, 4)
        assert env.rollout(3)["next", "k"].shape == (2, 3, 4)

    def test_unbatched_composite_still_expands(self):
        primer = TensorDictPrimer(Composite(k=Unbounded((4,))), expand_specs=True)
        assert make_env(primer, batch_size=(2,)).reset()["k"].shape == (2, 4)
        # a shape-() Composite whose leaf happens to start with N is expanded as asked
        primer = TensorDictPrimer(Composite(k=Unbounded((2, 4))), expand_specs=True)
        assert make_env(primer, batch_size=(2,)).reset()["k"].shape == (2, 2, 4)


class TestSpecs:
    def test_registered_in_observation_and_state_specs(self):
        env = make_env(lstm_primer(), batch_size=(3,))
        for spec in (env.observation_spec, env.state_spec):
            assert spec["rs_h"] == Unbounded((3, 1, 4))
            assert spec["rs_c"].shape == (3, 1, 4)
        assert env.state_keys == ["rs_h", "rs_c"]

    def test_auto_expand_detects_batch_dims(self):
        env = make_env(TensorDictPrimer(h=Unbounded((3, 1, 4))), batch_size=(3,))
        assert env.observation_spec["h"].shape == (3, 1, 4)  # already has the batch dims

    def test_expand_specs_true(self):
        # (num_layers, H) with num_layers == N would be taken as batched without the flag
        env = make_env(TensorDictPrimer(h=Unbounded((3, 4)), expand_specs=True), batch_size=(3,))
        assert env.observation_spec["h"].shape == (3, 3, 4)

    def test_expand_specs_false(self):
        with pytest.raises(ValueError, match="expand_specs=False"):
            make_env(TensorDictPrimer(h=Unbounded((1, 4)), expand_specs=False), batch_size=(3,))

    def test_duplicate_primer(self):
        env = make_env(lstm_primer())
        with pytest.raises(ValueError, match="duplicate primer for key 'rs_h'"):
            env.append_transform(TensorDictPrimer(rs_h=Unbounded((1, 4))))
        assert len(find_transform(env, TensorDictPrimer)) == 1
        env.rollout(2)

    def test_idempotent_add_with_find_transform(self):
        env = make_env(InitTracker())
        for _ in range(2):
            present = {k for p in find_transform(env, TensorDictPrimer) for k in p.out_keys}
            if "rs_h" not in present:
                env.append_transform(TensorDictPrimer(rs_h=Unbounded((1, 4))))
        assert len(find_transform(env, TensorDictPrimer)) == 1


class TestReset:
    def test_zeros_by_default(self):
        td = make_env(lstm_primer(), batch_size=(2,)).reset()
        assert td["rs_h"].shape == (2, 1, 4) and td["rs_h"].dtype == torch.float32
        assert (td["rs_h"] == 0).all() and (td["rs_c"] == 0).all()

    def test_default_value_number_and_dict(self):
        td = make_env(lstm_primer(default_value=2.5)).reset()
        assert (td["rs_h"] == 2.5).all()
        td = make_env(lstm_primer(default_value={"rs_h": 1.0, "rs_c": lambda: -1.0})).reset()
        assert (td["rs_h"] == 1).all() and (td["rs_c"] == -1).all()

    def test_default_value_callable_per_key(self):
        calls = []

        def init():
            calls.append(1)
            return torch.full((1, 4), float(len(calls)))

        td = make_env(lstm_primer(default_value=init), batch_size=(2,)).reset()
        assert len(calls) == 2
        assert (td["rs_h"] == 1).all() and (td["rs_c"] == 2).all()

    def test_single_default_value(self):
        calls = []

        def init():
            calls.append(1)
            return torch.randn(1, 4)

        td = make_env(lstm_primer(default_value=init, single_default_value=True)).reset()
        assert len(calls) == 1 and torch.equal(td["rs_h"], td["rs_c"])

    def test_default_value_wrong_shape(self):
        env_primer = lstm_primer(default_value=lambda: torch.zeros(5))
        with pytest.raises(ValueError, match="default value for 'rs_h' has shape \\(5,\\)"):
            make_env(env_primer).reset()

    def test_random(self):
        spec = Bounded(-1.0, 1.0, shape=(2, 3))
        env = make_env(TensorDictPrimer(h=spec, random=True), batch_size=(4,))
        a, b = env.reset()["h"], env.reset()["h"]
        assert a.shape == (4, 2, 3) and not torch.equal(a, b)
        assert env.observation_spec["h"].is_in(a)

    def test_integer_spec(self):
        td = make_env(TensorDictPrimer(k=Categorical(5, shape=(1,))), batch_size=(2,)).reset()
        assert td["k"].dtype == torch.int64 and td["k"].shape == (2, 1)

    def test_partial_reset(self):
        env = make_env(lstm_primer(), batch_size=(3,))
        td = env.reset()
        td["rs_h"] = torch.ones(3, 1, 4)
        td["_reset"] = torch.tensor([[True], [False], [True]])
        out = env.reset(td)
        assert out["rs_h"][:, 0, 0].tolist() == [0.0, 1.0, 0.0]
        assert (out["rs_c"] == 0).all()
        assert torch.equal(td["rs_h"], torch.ones(3, 1, 4))  # input not modified in place

    @pytest.mark.parametrize(
        ("spec", "default", "incoming"),
        [
            (Unbounded((1, 4)), 2.5, torch.ones(3, 1, 4)),  # a number: filled in place
            (Categorical(5, shape=(1,)), 3, torch.ones(3, 1, dtype=torch.int64)),
            (Unbounded((1, 4)), 2.5, torch.ones(3, 1, 4, dtype=torch.float64)),  # other dtype
            (Unbounded((1, 4)), lambda: torch.full((1, 4), 2.5), torch.ones(3, 1, 4)),
        ],
        ids=["number", "integer", "other-dtype", "callable"],
    )
    def test_partial_reset_value_paths_agree(self, spec, default, incoming):
        # A number is filled into the incoming value; a callable builds a fresh one: the
        # reset envs get the initial value, the others keep theirs, whatever the path.
        primer = TensorDictPrimer(k=spec, default_value=default)
        env = make_env(primer, batch_size=(3,))
        td = env.reset()
        td["k"] = incoming
        td["_reset"] = torch.tensor([[True], [False], [True]])
        out = primer._reset(td, TensorDict({}, batch_size=[3]))["k"]  # the primer alone
        mask = torch.tensor([True, False, True]).reshape(3, *[1] * (incoming.ndim - 1))
        expected_value = torch.as_tensor(2.5 if callable(default) else default, dtype=spec.dtype)
        expected = torch.where(mask, expected_value, incoming)
        assert out.dtype == expected.dtype and torch.equal(out, expected)

    def test_partial_reset_without_incoming_value(self):
        env = make_env(lstm_primer(default_value=3.0), batch_size=(2,))
        td = env.reset().exclude("rs_h")
        td["_reset"] = torch.tensor([[False], [True]])
        assert (env.reset(td)["rs_h"] == 3).all()

    def test_nested_keys(self):
        primer = TensorDictPrimer({("rs", "h"): Unbounded((1, 4)), ("rs", "c"): Unbounded((1, 4))})
        env = make_env(primer, batch_size=(2,))
        td = env.reset()
        assert td["rs", "h"].shape == (2, 1, 4)
        assert ("rs", "c") in env.state_spec
        td = env.step(env.rand_action(td))
        td["next", "rs", "h"] = torch.ones(2, 1, 4)
        nxt = env.step_mdp(td)
        assert (nxt["rs", "h"] == 1).all() and (nxt["rs", "c"] == 0).all()


class TestStep:
    def test_policy_value_is_kept_and_carried(self):
        env = make_env(lstm_primer(), batch_size=(2,))
        td = env.rand_action(env.reset())
        td["next", "rs_h"] = torch.full((2, 1, 4), 5.0)
        env.step(td)
        assert (td["next", "rs_h"] == 5).all()
        assert (td["next", "rs_c"] == 0).all()  # not written by the policy: copied forward
        nxt = env.step_mdp(td)
        assert (nxt["rs_h"] == 5).all() and (nxt["rs_c"] == 0).all()

    def test_non_recurrent_policy_leaves_state_unchanged(self):
        env = make_env(lstm_primer(default_value=7.0))
        data = env.rollout(4)
        assert (data["rs_h"] == 7).all() and (data["next", "rs_h"] == 7).all()

    def test_missing_state_at_step(self):
        env = make_env(lstm_primer())
        td = env.rand_action(env.reset().exclude("rs_h"))
        with pytest.raises(KeyError, match="'rs_h' is missing from the step input"):
            env.step(td)

    def test_recurrent_rollout_with_partial_resets(self):
        env = make_env(
            lstm_primer(),
            batch_size=(2,),
            max_steps=[2, 3],
        ).append_transform(InitTracker())

        def policy(td):
            td["next", "rs_h"] = td["rs_h"] + 1
            td["next", "rs_c"] = td["rs_c"] - 1
            return env.rand_action(td)

        data = env.rollout(6, policy, break_when_any_done=False)
        assert data["rs_h"][..., 0, 0].tolist() == [[0, 1, 0, 1, 0, 1], [0, 1, 2, 0, 1, 2]]
        assert torch.equal(data["rs_h"][..., 0, 0], data["observation"][..., 0])
        assert torch.equal(data["rs_c"], -data["rs_h"])
        starts = data["is_init"].squeeze(-1)
        assert ((data["rs_h"][..., 0, 0] == 0) == starts).all()


class TestFromModule:
    def test_keys_shapes_dtype_device_of_the_module(self):
        from recurrl.modules import LSTMModule

        lstm = LSTMModule(3, 5, num_layers=2, in_key="obs", out_key="f").double()
        primer = TensorDictPrimer.from_module(lstm)
        assert list(primer.primers.keys(True, True)) == lstm.state_keys
        for key in lstm.state_keys:
            spec = primer.primers[key]
            assert isinstance(spec, Unbounded) and spec.shape == (2, 5)
            assert spec.dtype == torch.float64 and spec.device == torch.device("cpu")
        assert primer.expand_specs is True
        # the method on the module is this constructor
        made = lstm.make_tensordict_primer()
        assert type(made) is TensorDictPrimer
        assert made.primers == primer.primers

    def test_expands_to_any_batch_size(self):
        class State(torch.nn.Module):
            recurrent_state_spec = {("nested", "h"): (torch.Size([3, 2]), torch.float32)}

        env = make_env(TensorDictPrimer.from_module(State()), batch_size=(3,))
        assert env.reset()["nested", "h"].shape == (3, 3, 2)
        assert TensorDictPrimer.from_module(State(), device="cpu").primers["nested", "h"].device

    def test_module_without_state_raises(self):
        with pytest.raises(TypeError, match=r"recurrent_state_spec mapping.*received Linear"):
            TensorDictPrimer.from_module(torch.nn.Linear(2, 2))
