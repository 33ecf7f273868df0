"""Tests of Transform, Compose, TransformedEnv, find_transform, and the contract suite."""

import copy
import pickle

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import (
    Compose,
    Composite,
    FlickerObservation,
    GrayScale,
    GymEnv,
    InitTracker,
    MaskObservation,
    ObservationNorm,
    OneHotObservation,
    PreviousAction,
    PreviousReward,
    Resize,
    RewardSum,
    StepCounter,
    TensorDictPrimer,
    ToTensorImage,
    Transform,
    TransformedEnv,
    Unbounded,
    check_env_specs,
    find_transform,
)
from recurrl.envs.specs import Bounded
from recurrl.envs.transforms.transform import _merged_on_partial_reset
from recurrl.testing import CountingEnv
from tests.envs.transforms._pixels import FakePixels


class Scale(Transform):
    """Multiplies the observation on reset and step; adds a "scaled" observation key."""

    def __init__(self, factor=2.0):
        super().__init__(in_keys=["observation"], out_keys=["scaled"])
        self.factor = factor

    def _apply(self, td):
        td.set("scaled", td["observation"] * self.factor)
        return td

    def _reset(self, tensordict, tensordict_reset):
        return self._apply(tensordict_reset)

    def _step(self, tensordict, next_tensordict):
        return self._apply(next_tensordict)

    def transform_observation_spec(self, observation_spec):
        observation_spec["scaled"] = observation_spec["observation"].clone()
        return observation_spec


class Recorder(Transform):
    """Appends its name to a shared log at every hook call."""

    def __init__(self, name, log):
        super().__init__()
        self.name, self.log = name, log

    def _reset(self, tensordict, tensordict_reset):
        self.log.append(("reset", self.name))
        return tensordict_reset

    def _step(self, tensordict, next_tensordict):
        self.log.append(("step", self.name))
        return next_tensordict

    def transform_observation_spec(self, observation_spec):
        self.log.append(("spec", self.name))
        return observation_spec


class BadSpec(Transform):
    def transform_observation_spec(self, observation_spec):
        raise ValueError("bad spec hook")


class TestTransform:
    def test_defaults_are_identity(self):
        env = TransformedEnv(CountingEnv(), Transform())
        assert env.observation_spec == CountingEnv().observation_spec
        data = env.rollout(3)
        assert data["observation"][:, 0].tolist() == [0, 1, 2]

    def test_custom_transform(self):
        env = TransformedEnv(CountingEnv(batch_size=(2,)), Scale(3.0))
        assert "scaled" in env.observation_spec
        td = env.step(env.rand_action(env.reset()))
        assert td["next", "scaled"][0, 0].item() == 3.0
        assert env.step_mdp(td)["scaled"][0, 0].item() == 3.0

    def test_parent(self):
        t = Scale()
        assert t.parent is None
        env = TransformedEnv(CountingEnv(), t)
        assert t.parent is env
        with pytest.raises(ValueError, match="already attached to another env"):
            TransformedEnv(CountingEnv(), t)
        clone = t.clone()
        assert clone.parent is None and clone.factor == t.factor
        TransformedEnv(CountingEnv(), clone)

    def test_forward_raises(self):
        with pytest.raises(ValueError, match=r"no parent env.*TransformedEnv"):
            Scale()(TensorDict({}, batch_size=[]))
        attached = Scale()
        TransformedEnv(CountingEnv(), attached)
        with pytest.raises(ValueError, match=r"runs inside its env.*env.step"):
            attached(TensorDict({}, batch_size=[]))

    def test_require_parent(self):
        t = Scale()
        with pytest.raises(ValueError, match=r"Scale: reading x needs the env.*no parent env"):
            t._require_parent("reading x")
        env = TransformedEnv(CountingEnv(), t)
        assert t._require_parent("reading x") is env

    def test_not_a_transform(self):
        with pytest.raises(TypeError, match="expected a recurrl Transform"):
            TransformedEnv(CountingEnv(), torch.nn.Identity())


class TestCompose:
    def test_container(self):
        a, b, c = Scale(), InitTracker(), Transform()
        comp = Compose(a, b)
        assert len(comp) == 2 and comp[0] is a and list(comp) == [a, b]
        comp.append(c)
        assert comp[-1] is c
        comp.insert(0, Transform())
        assert len(comp) == 4
        assert isinstance(comp[1:3], Compose) and comp[1:3][0] is a
        assert comp.pop() is c and len(comp) == 3
        assert comp.out_keys == ["scaled", "is_init"]

    def test_order(self):
        log = []
        env = TransformedEnv(CountingEnv(), Compose(Recorder("a", log), Recorder("b", log)))
        assert log == [("spec", "a"), ("spec", "b")]
        log.clear()
        env.step(env.rand_action(env.reset()))
        assert log == [("reset", "a"), ("reset", "b"), ("step", "a"), ("step", "b")]

    def test_given_compose_is_the_env_transform(self):
        comp = Compose(InitTracker())
        env = TransformedEnv(CountingEnv(), comp)
        assert env.transform is comp and comp[0].parent is env

    def test_children_parented_on_append(self):
        env = TransformedEnv(CountingEnv(), InitTracker())
        t = Transform()
        env.transform.append(t)
        assert t.parent is env


class TestTransformedEnv:
    def test_attributes(self):
        base = CountingEnv(batch_size=(2,))
        env = TransformedEnv(base)
        assert env.base_env is base and isinstance(env.transform, Compose)
        assert len(env.transform) == 0
        assert env.batch_size == (2,) and env.device == base.device
        assert env.max_steps is base.max_steps  # attributes fall back to the base env

    def test_append_and_insert_in_place(self):
        env = TransformedEnv(CountingEnv())
        log = []
        out = env.append_transform(Recorder("b", log))
        assert out is env
        env.insert_transform(0, Recorder("a", log))
        log.clear()
        env.reset()
        assert log == [("reset", "a"), ("reset", "b")]

    def test_specs_recomputed_on_append(self):
        env = TransformedEnv(CountingEnv())
        assert "is_init" not in env.observation_spec
        env.append_transform(InitTracker())
        assert "is_init" in env.observation_spec

    def test_specs_follow_base_env(self):
        base = CountingEnv()
        env = TransformedEnv(base, InitTracker())
        base.observation_spec = Composite(observation=Unbounded(3), extra=Unbounded(1))
        assert "extra" in env.observation_spec and "is_init" in env.observation_spec

    def test_specs_read_only(self):
        env = TransformedEnv(CountingEnv())
        with pytest.raises(RuntimeError, match=r"base_env\.observation_spec"):
            env.observation_spec = Composite()

    def test_failed_append_rolls_back(self):
        env = TransformedEnv(CountingEnv(), InitTracker())
        bad = BadSpec()
        with pytest.raises(ValueError, match="bad spec hook"):
            env.append_transform(bad)
        assert len(env.transform) == 1 and bad.parent is None
        env.rollout(2)

    def test_same_instance_twice(self):
        t = InitTracker()
        env = TransformedEnv(CountingEnv(), t)
        with pytest.raises(ValueError, match="already in this env"):
            env.append_transform(t)

    def test_nested_envs_and_find_transform(self):
        inner = TransformedEnv(CountingEnv(), InitTracker())
        outer = TransformedEnv(inner, Compose(Scale(), TensorDictPrimer(h=Unbounded(2))))
        expected = [InitTracker, Scale, TensorDictPrimer]  # the adopted Compose is the root
        assert [type(t) for t in find_transform(outer, Transform)] == expected
        outer.append_transform(Compose(Transform()))
        assert [type(t) for t in find_transform(outer, Compose)] == [Compose]
        assert len(find_transform(outer, TensorDictPrimer)) == 1
        assert find_transform(CountingEnv(), InitTracker) == []
        td = outer.reset()
        assert {"is_init", "scaled", "h"} <= set(td.keys())

    def test_specs_follow_edits_of_the_compose(self):
        # Editing env.transform directly must not leave stale specs (or the partial-reset
        # keys cached from them) behind.
        env = TransformedEnv(CountingEnv(batch_size=(2,)), InitTracker())
        td = env.step_mdp(env.step(env.rand_action(env.reset())))
        td["_reset"] = torch.tensor([[True], [False]])
        env.reset(td)  # caches the keys of a partial reset
        env.transform.append(RewardSum())
        assert "episode_reward" in env.observation_spec
        td["episode_reward"] = torch.ones(2, 1)
        out = env.reset(td)  # RewardSum promises nothing: every key is merged
        assert out["episode_reward"].squeeze(-1).tolist() == [0.0, 1.0]
        env.transform.pop()
        assert "episode_reward" not in env.observation_spec

    def test_partial_reset_merges_after_in_place_transforms(self):
        class AddTen(Transform):
            def _reset(self, tensordict, tensordict_reset):
                tensordict_reset["observation"] = tensordict_reset["observation"] + 10
                return tensordict_reset

            def _step(self, tensordict, next_tensordict):
                next_tensordict["observation"] = next_tensordict["observation"] + 10
                return next_tensordict

        env = TransformedEnv(CountingEnv(batch_size=(2,), max_steps=9), AddTen())
        td = env.step_mdp(env.step(env.rand_action(env.reset())))
        assert td["observation"][:, 0].tolist() == [11.0, 11.0]
        td["_reset"] = torch.tensor([[True], [False]])
        out = env.reset(td)  # the kept env is not transformed twice
        assert out["observation"][:, 0].tolist() == [10.0, 11.0]
        td["_reset"] = torch.tensor([[False], [False]])
        assert env.reset(td)["observation"][:, 0].tolist() == [11.0, 11.0]

    def test_partial_reset_merge_skipped_only_on_promise(self):
        # InitTracker and the primer merge their keys themselves on a partial reset; a
        # transform without that promise, even a subclass of one, gets every key merged.
        class Marker(InitTracker):
            def _reset(self, tensordict, tensordict_reset):
                tensordict_reset.set(self.init_key, self._flag(tensordict_reset, True))
                return tensordict_reset  # every env flagged: needs the env's merge

        primer = TensorDictPrimer(h=Unbounded((3,)))
        promised = TransformedEnv(CountingEnv(batch_size=(2,)), Compose(InitTracker(), primer))
        assert _merged_on_partial_reset(promised.transform) == {"is_init", "h"}
        marked = TransformedEnv(CountingEnv(batch_size=(2,)), Marker())
        assert _merged_on_partial_reset(marked.transform) == set()
        mixed = TransformedEnv(CountingEnv(batch_size=(2,)), Compose(InitTracker(), RewardSum()))
        assert _merged_on_partial_reset(mixed.transform) == set()
        td = marked.step_mdp(marked.step(marked.rand_action(marked.reset())))
        td["_reset"] = torch.tensor([[True], [False]])
        assert marked.reset(td)["is_init"].squeeze(-1).tolist() == [True, False]
        td = promised.step_mdp(promised.step(promised.rand_action(promised.reset())))
        td["h"] = torch.ones(2, 3)
        td["_reset"] = torch.tensor([[False], [True]])
        out = promised.reset(td)
        assert out["is_init"].squeeze(-1).tolist() == [False, True]
        assert out["h"].tolist() == [[1.0] * 3, [0.0] * 3]

    def test_copy_and_pickle_reattach(self):
        env = TransformedEnv(CountingEnv(), Compose(InitTracker(), Scale()))
        for clone in (copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
            assert clone.transform.parent is clone
            assert all(t.parent is clone for t in clone.transform)
            assert clone.rollout(3).batch_size == (3,)
        assert env.transform[0].parent is env

    def test_seed_and_close_propagate(self):
        env = TransformedEnv(CountingEnv())
        assert env.set_seed(1) == 1
        env.close()
        assert env.base_env.is_closed


def _transform_factories():
    return {
        "init_tracker": lambda: InitTracker(),
        "primer": lambda: TensorDictPrimer(rs_h=Unbounded((1, 4)), rs_c=Unbounded((1, 4))),
        "primer_random": lambda: TensorDictPrimer(
            {("rs", "h"): Bounded(-1.0, 1.0, shape=(2, 3))}, random=True
        ),
        "compose": lambda: Compose(InitTracker(), TensorDictPrimer(rs_h=Unbounded((1, 4)))),
        "scale": lambda: Scale(),
        "step_counter": lambda: StepCounter(),
        "step_counter_limit": lambda: StepCounter(3),
        "reward_sum": lambda: RewardSum(),
        "mask_observation": lambda: MaskObservation([0, 2]),
        "mask_observation_out_key": lambda: MaskObservation([1], out_key="partial"),
        "flicker_observation": lambda: FlickerObservation(0.5, seed=0),
        "previous_action": lambda: PreviousAction(),
        "previous_action_one_hot": lambda: PreviousAction(one_hot=True),
        "previous_reward": lambda: PreviousReward(),
        # pixel transforms, on FakePixels' uint8 [*B, 6, 8, 3] image of the observation
        "to_tensor_image": lambda: Compose(FakePixels(), ToTensorImage()),
        "gray_scale": lambda: Compose(FakePixels(), ToTensorImage(), GrayScale()),
        "resize": lambda: Compose(FakePixels(), ToTensorImage(), Resize(4, 5)),
        "observation_norm": lambda: ObservationNorm(loc=1.0, scale=2.0, in_keys=["observation"]),
        "pixel_pipeline": lambda: Compose(
            FakePixels(),
            ToTensorImage(),
            GrayScale(),
            Resize(3, 3),
            ObservationNorm(loc=0.5, scale=0.25, in_keys=["pixels"], standard_normal=True),
        ),
        "recurrent_inputs": lambda: Compose(
            InitTracker(),
            StepCounter(4),
            RewardSum(),
            MaskObservation([2, 0]),
            PreviousAction(one_hot=True),
            PreviousReward(),
            TensorDictPrimer(rs_h=Unbounded((1, 4))),
        ),
    }


FACTORIES = _transform_factories()


@pytest.mark.parametrize("name", list(FACTORIES))
class TestTransformContract:
    """Every transform: standalone, composed, batched with partial resets, state_dict."""

    @staticmethod
    def check_step_data(env, td):
        assert env.observation_spec.is_in(td.select(*env.observation_keys))
        assert env.state_spec.is_in(td.select(*env.state_keys))
        assert "_reset" not in td.keys(include_nested=True)

    def test_standalone_single_env(self, name):
        transform = FACTORIES[name]()
        env = TransformedEnv(CountingEnv(max_steps=3), transform)
        td = env.reset()
        self.check_step_data(env, td)
        for key in transform.out_keys:
            assert key in td.keys(include_nested=True)
        td = env.step_mdp(env.step(env.rand_action(td)))
        self.check_step_data(env, td)
        data = env.rollout(7, break_when_any_done=False)
        assert data.batch_size == (7,)

    def test_composed(self, name):
        env = TransformedEnv(CountingEnv(), Compose(Transform(), FACTORIES[name](), Transform()))
        self.check_step_data(env, env.reset())
        assert env.rollout(3).batch_size == (3,)

    def test_batched_with_partial_resets(self, name):
        env = TransformedEnv(CountingEnv(batch_size=(3,), max_steps=[2, 3, 4]), FACTORIES[name]())
        data = env.rollout(8, break_when_any_done=False)
        assert data.batch_size == (3, 8)
        td = env.reset()
        for _ in range(5):
            td = env.step_mdp(env.step(env.rand_action(td)))
            td["_reset"] = td["done"].clone()
            reset_td = env.reset(td)
            self.check_step_data(env, reset_td)
            del td["_reset"]
            td.update(reset_td)

    def test_state_dict_round_trip(self, name):
        transform = FACTORIES[name]()
        env = TransformedEnv(CountingEnv(), transform)
        other = FACTORIES[name]()
        other.load_state_dict(transform.state_dict())
        TransformedEnv(CountingEnv(), other).rollout(2)
        env2 = TransformedEnv(CountingEnv(), FACTORIES[name]())
        env2.load_state_dict(env.state_dict())
        assert env2.observation_spec == env.observation_spec

    def test_batched_gym_vector_env(self, name):
        env = TransformedEnv(GymEnv("CartPole-v1", num_envs=2, seed=0), FACTORIES[name]())
        torch.manual_seed(0)
        data = env.rollout(30, break_when_any_done=False)
        assert data.batch_size == (2, 30)
        check_env_specs(env, seed=0, steps=12)
        env.close()

    def test_check_env_specs_counting_envs(self, name):
        check_env_specs(TransformedEnv(CountingEnv(max_steps=2), FACTORIES[name]()), steps=5)
        env = TransformedEnv(
            CountingEnv(batch_size=(2, 2), max_steps=[[1, 2], [3, 4]]), FACTORIES[name]()
        )
        check_env_specs(env, seed=0, steps=7)

    def test_clone_is_independent(self, name):
        transform = FACTORIES[name]()
        env = TransformedEnv(CountingEnv(), transform)
        env2 = TransformedEnv(CountingEnv(batch_size=(2,)), transform.clone())
        assert env2.reset().batch_size == (2,)
        assert transform.parent is env


@pytest.mark.parametrize(
    "make",
    [
        InitTracker,
        lambda: TensorDictPrimer(rs=Unbounded((1, 4))),
        lambda: StepCounter(3),
        RewardSum,
        PreviousAction,
        PreviousReward,
        lambda: MaskObservation([0]),
        lambda: FlickerObservation(0.5),
        OneHotObservation,
        lambda: Compose(InitTracker()),
    ],
)
def test_every_transform_used_without_a_parent_env_raises_value_error(make):
    """What needs the env (specs, sizes) or an env to run in: ValueError when detached
    (code written for the reference catches ValueError); what does not need it works."""
    t = make()
    td = TensorDict({"observation": torch.zeros(3), "reward": torch.zeros(1)}, [])
    with pytest.raises(ValueError, match="no parent env"):
        t(td)
    for hook in (
        lambda: t._reset(td.clone(), td.clone()),
        lambda: t.transform_observation_spec(Composite(observation=Unbounded((3,)))),
    ):
        try:
            hook()
        except ValueError as err:
            assert "no parent env" in str(err) or "cannot" in str(err)
        except TypeError as err:  # OneHotObservation of an Unbounded spec: not a parent error
            assert "cannot one-hot encode" in str(err)
