"""Tests of recurrl.envs.transforms.gray_scale (GrayScale, rgb_to_grayscale)."""

import pytest
import torch

from recurrl.envs import Bounded, GrayScale, ToTensorImage, TransformedEnv, check_env_specs
from recurrl.envs.transforms.gray_scale import rgb_to_grayscale
from recurrl.testing import CountingEnv
from tests.envs.transforms._pixels import FakePixels


def test_values_by_hand():
    image = torch.tensor([0.2, 0.4, 0.6]).reshape(3, 1, 1)
    expected = 0.2989 * 0.2 + 0.587 * 0.4 + 0.114 * 0.6
    assert rgb_to_grayscale(image).item() == pytest.approx(expected, abs=1e-7)


def test_matches_the_weighted_sum_with_batch_dims():
    torch.manual_seed(0)
    image = torch.rand(2, 5, 3, 4, 6)
    weights = torch.tensor([0.2989, 0.587, 0.114])
    expected = torch.einsum("...chw,c->...hw", image, weights).unsqueeze(-3)
    out = GrayScale()._apply_transform(image)
    assert out.shape == (2, 5, 1, 4, 6)
    torch.testing.assert_close(out, expected)


def test_integer_images_keep_their_dtype():
    image = torch.tensor([100, 200, 50], dtype=torch.uint8).reshape(3, 1, 1)
    # 0.2989 * 100 + 0.587 * 200 + 0.114 * 50 = 29.89 + 117.4 + 5.7 = 152.99 -> 152
    assert rgb_to_grayscale(image).item() == 152
    assert rgb_to_grayscale(image).dtype == torch.uint8


def test_spec_and_data_in_an_env():
    env = TransformedEnv(CountingEnv(batch_size=(3,), max_steps=[2, 3, 4]), FakePixels())
    env.append_transform(ToTensorImage())
    env.append_transform(GrayScale())
    spec = env.observation_spec["pixels"]
    assert isinstance(spec, Bounded) and spec.shape == (3, 1, 6, 8)
    assert float(spec.high.max()) == pytest.approx(0.9999, abs=1e-6)
    data = env.rollout(4, break_when_any_done=False)
    chw = FakePixels.image(data["observation"]).movedim(-1, -3).float() / 255
    torch.testing.assert_close(data["pixels"], rgb_to_grayscale(chw))
    check_env_specs(env, seed=0, steps=6)


def test_channels_last_input_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"3 channels at dim -3.*ToTensorImage"):
        TransformedEnv(CountingEnv(), FakePixels()).append_transform(GrayScale())
