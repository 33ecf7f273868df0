"""ObservationTransform: one override point (_apply_transform) plus the spec hook, applied at
reset, at every step and to the observation spec."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import (
    Bounded,
    MaskObservation,
    ObservationTransform,
    OneHotObservation,
    TransformedEnv,
    Unbounded,
)
from recurrl.testing import CountingEnv


class Scale(ObservationTransform):
    def __init__(self, factor: float, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def _apply_transform(self, observation):
        return observation * self.factor


class Widen(ObservationTransform):
    """Changes the shape: the spec hook says so."""

    def _apply_transform(self, observation):
        return torch.cat([observation, -observation], -1)

    def _transform_spec(self, spec):
        return Unbounded((*spec.shape[:-1], 2 * spec.shape[-1]), device=spec.device)


def test_in_place_at_reset_and_step():
    env = TransformedEnv(CountingEnv(batch_size=(2,)), Scale(10.0))
    td = env.reset()
    assert td["observation"].eq(0).all()
    td = env.step(env.rand_action(td))
    assert td["next", "observation"].eq(10.0).all()
    assert (
        env.observation_spec["observation"]
        == CountingEnv(batch_size=(2,)).observation_spec["observation"]
    )


def test_new_key_keeps_the_input_and_copies_its_spec():
    env = TransformedEnv(CountingEnv(), Scale(3.0, out_key="scaled"))
    td = env.step(env.rand_action(env.reset()))
    assert td["next", "observation"].eq(1).all() and td["next", "scaled"].eq(3).all()
    spec = env.observation_spec
    assert spec["scaled"] == spec["observation"] and spec["scaled"] is not spec["observation"]


def test_spec_hook_changes_the_declared_spec():
    env = TransformedEnv(CountingEnv(), Widen())
    assert env.observation_spec["observation"].shape == (6,)
    assert env.reset()["observation"].shape == (6,)


def test_errors_name_the_missing_override_and_keys():
    with pytest.raises(NotImplementedError, match=r"overrides _apply_transform"):
        TransformedEnv(CountingEnv(), ObservationTransform()).reset()
    with pytest.raises(KeyError, match="no observation 'pixels'"):
        TransformedEnv(CountingEnv(), Scale(2.0, in_key="pixels")).observation_spec  # noqa: B018
    env = TransformedEnv(CountingEnv(), Scale(2.0, out_key="copy"))
    with pytest.raises(ValueError, match="already declares 'copy'"):
        env.append_transform(Scale(2.0, out_key="copy"))


def test_the_observation_transforms_share_the_base():
    for transform in (MaskObservation([0]), OneHotObservation()):
        assert isinstance(transform, ObservationTransform)
        assert "_reset" not in type(transform).__dict__ and "_step" not in type(transform).__dict__
        assert "_apply_transform" in type(transform).__dict__
    spec = MaskObservation([1], out_key="m")._transform_spec(Bounded(0.0, 1.0, shape=(2,)))
    assert spec.shape == (1,)


def test_a_transform_without_apply_names_the_bases_to_use():
    from recurrl.envs.transforms.observation import AppliedToObservations

    class Mine(AppliedToObservations):
        pass

    with pytest.raises(NotImplementedError, match=r"Mine does not implement _apply.*Observ"):
        Mine()._apply(TensorDict({}, batch_size=[]))
