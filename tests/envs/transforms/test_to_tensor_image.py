"""Tests of recurrl.envs.transforms.to_tensor_image.ToTensorImage."""

import pytest
import torch

from recurrl.envs import (
    Bounded,
    Compose,
    GymEnv,
    ToTensorImage,
    TransformedEnv,
    Unbounded,
    check_env_specs,
)
from recurrl.testing import CountingEnv
from tests.envs.transforms._pixels import FakePixels


def test_values_by_hand():
    image = torch.tensor([[[0, 51, 255], [102, 153, 204]]], dtype=torch.uint8)  # [H=1, W=2, 3]
    out = ToTensorImage()._apply_transform(image)
    expected = torch.tensor([[[0.0, 0.4]], [[0.2, 0.6]], [[1.0, 0.8]]])  # [3, 1, 2]
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)


def test_from_int_and_float_inputs():
    image = torch.full((2, 2, 3), 51.0)
    assert float(ToTensorImage()._apply_transform(image).max()) == 51.0  # float: no scaling
    assert float(ToTensorImage(from_int=True)._apply_transform(image).max()) == pytest.approx(0.2)
    as_int = torch.full((2, 2, 3), 51, dtype=torch.uint8)
    assert float(ToTensorImage(from_int=False)._apply_transform(as_int).max()) == 51.0
    out = ToTensorImage(dtype=torch.float64)._apply_transform(as_int)
    assert out.dtype == torch.float64


def test_unsqueeze_only_for_three_dims():
    t = ToTensorImage(unsqueeze=True)
    assert t._apply_transform(torch.zeros(4, 5, 3, dtype=torch.uint8)).shape == (1, 3, 4, 5)
    assert t._apply_transform(torch.zeros(2, 4, 5, 3, dtype=torch.uint8)).shape == (2, 3, 4, 5)


def test_shape_tolerant_leaves_other_layouts():
    t = ToTensorImage(shape_tolerant=True)
    assert t._apply_transform(torch.zeros(3, 4, 5, dtype=torch.uint8)).shape == (3, 4, 5)
    assert t._apply_transform(torch.zeros(4, 5, 3, dtype=torch.uint8)).shape == (3, 4, 5)


def test_spec_and_data_on_a_batched_env():
    env = TransformedEnv(CountingEnv(batch_size=(2,), max_steps=3), FakePixels())
    env.append_transform(ToTensorImage())
    spec = env.observation_spec["pixels"]
    assert isinstance(spec, Bounded) and spec.shape == (2, 3, 6, 8)
    assert spec.dtype == torch.float32 and float(spec.low.min()) == 0.0
    assert float(spec.high.max()) == 1.0
    data = env.rollout(5, break_when_any_done=False)
    raw = FakePixels.image(data["observation"])
    torch.testing.assert_close(data["pixels"], raw.permute(0, 1, 4, 2, 3).float() / 255)
    check_env_specs(env, seed=0, steps=6)


class UnboundedPixels(FakePixels):
    def transform_observation_spec(self, observation_spec):
        observation_spec = super().transform_observation_spec(observation_spec)
        pixels = observation_spec["pixels"]
        observation_spec["pixels"] = Unbounded(pixels.shape, dtype=torch.uint8)
        return observation_spec


def test_unbounded_input_spec_stays_unbounded():
    env = TransformedEnv(CountingEnv(), UnboundedPixels())
    env.append_transform(ToTensorImage(out_keys=["chw"]))
    spec = env.observation_spec["chw"]
    assert isinstance(spec, Unbounded) and spec.shape == (3, 6, 8)
    assert spec.dtype == torch.float32


def test_cartpole_pixels_are_the_rendered_frame():
    base = GymEnv("CartPole-v1", from_pixels=True, seed=0)
    env = TransformedEnv(base, Compose(ToTensorImage()))
    td = env.reset()
    frame = torch.from_numpy(base.env.render().copy())
    torch.testing.assert_close(td["pixels"], frame.permute(2, 0, 1).float() / 255)
    env.close()


def test_errors():
    with pytest.raises(ValueError, match="floating dtype"):
        ToTensorImage(dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"\[\*B, H, W, C\]"):
        ToTensorImage()._apply_transform(torch.zeros(3, 4))
    with pytest.raises(KeyError, match="no observation 'pixels'"):
        TransformedEnv(CountingEnv(), ToTensorImage())


def test_a_per_key_transform_without_its_hook_names_it():
    from recurrl.envs.transforms._per_key import PerKeyObservationTransform

    class Mine(PerKeyObservationTransform):
        pass

    with pytest.raises(NotImplementedError, match="Mine does not implement _apply_transform"):
        Mine(in_keys=["pixels"])._apply_transform(torch.zeros(1))
