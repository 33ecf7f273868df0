"""Tests of recurrl.envs.transforms.resize.Resize."""

import numpy as np
import pytest
import torch

from recurrl.envs import Resize, ToTensorImage, TransformedEnv, check_env_specs
from recurrl.testing import CountingEnv
from tests.envs.transforms._pixels import FakePixels


def test_nearest_by_hand():
    image = torch.arange(16.0).reshape(1, 4, 4)
    out = Resize(2, 2, interpolation="nearest")._apply_transform(image)
    torch.testing.assert_close(out, torch.tensor([[[0.0, 2.0], [8.0, 10.0]]]))


def test_sizes_follow_the_references_w_h_order():
    out = Resize(2, 3)._apply_transform(torch.rand(5, 1, 8, 8))
    assert out.shape == (5, 1, 2, 3)  # dim -2 from w, dim -1 from h
    assert Resize((4, 6))._apply_transform(torch.rand(1, 8, 8)).shape == (1, 4, 6)
    assert Resize(7)._apply_transform(torch.rand(2, 3, 9, 9)).shape == (2, 3, 7, 7)


def test_bilinear_matches_pil_antialiased_resize():
    # PIL's bilinear downscale is antialiased; torch's antialias=True reproduces it
    Image = pytest.importorskip("PIL.Image", reason="Pillow (the reference) is not installed")

    torch.manual_seed(0)
    image = torch.rand(30, 40)
    pil = Image.fromarray(image.numpy().astype(np.float32), mode="F").resize(
        (10, 12), Image.BILINEAR
    )
    expected = torch.from_numpy(np.array(pil))  # (height 12, width 10)
    out = Resize(12, 10)._apply_transform(image.reshape(1, 30, 40))[0]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_constant_images_stay_constant_and_same_size_is_a_no_op():
    out = Resize(5, 5)._apply_transform(torch.full((2, 1, 17, 23), 0.25))
    torch.testing.assert_close(out, torch.full((2, 1, 5, 5), 0.25))
    image = torch.rand(1, 5, 5)
    assert Resize(5, 5)._apply_transform(image) is image


def test_integer_images_are_rounded_back():
    image = torch.tensor([[[0, 255], [255, 0]]], dtype=torch.uint8)
    out = Resize(1, 1, interpolation="area")._apply_transform(image)
    assert out.dtype == torch.uint8 and out.item() == 128  # 127.5 rounds half to even: 128


def test_spec_and_data_in_a_batched_env():
    env = TransformedEnv(CountingEnv(batch_size=(2,), max_steps=[2, 5]), FakePixels())
    env.append_transform(ToTensorImage())
    env.append_transform(Resize(3, 4))
    assert env.observation_spec["pixels"].shape == (2, 3, 3, 4)
    data = env.rollout(6, break_when_any_done=False)
    assert data["pixels"].shape == (2, 6, 3, 3, 4)
    check_env_specs(env, seed=0, steps=8)


@pytest.mark.parametrize(
    ("args", "match"),
    [((0,), "sizes >= 1"), ((2, 2, "lanczos"), "interpolation in"), (([1, 2, 3],), "pair")],
)
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        Resize(*args)


def test_channels_last_input_raises_with_the_fix():
    with pytest.raises(ValueError, match="ToTensorImage"):
        Resize(2)._apply_transform(torch.zeros(3, 3))
