"""The image encoders' registry and the flat and one-hot encoders of symbolic grids (the CNN,
NetworkInputs and the env side are covered in test_env_inputs.py)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from recurrl.modules import set_recurrent_mode
from recurrl.trainers.config import ModelConfig
from recurrl.trainers.encoders import (
    IMAGE_ENCODERS,
    FlatImageEncoder,
    ImageEncoder,
    InputEncoder,
    ObsInputs,
    OneHotImageEncoder,
    add_image_encoder,
    image_encoder,
)
from recurrl.trainers.models import ActorCritic, QNetwork

from ._helpers import parse_train


def test_flat_encoder_is_one_linear_layer_over_the_unscaled_entries():
    torch.manual_seed(0)
    enc = FlatImageEncoder((7, 7, 3), 16)
    pixels = torch.randint(0, 11, (4, 7, 7, 3), dtype=torch.uint8)
    expected = torch.relu(pixels.reshape(4, -1).float() @ enc.linear.weight.T + enc.linear.bias)
    torch.testing.assert_close(enc(pixels), expected)
    seq = torch.randint(0, 11, (2, 5, 7, 7, 3), dtype=torch.uint8)
    out = enc(seq)
    assert out.shape == (2, 5, 16)
    torch.testing.assert_close(out[1, 3], enc(seq[1, 3]))  # the same per frame
    assert sum(p.numel() for p in enc.parameters()) == 147 * 16 + 16


def test_flat_encoder_tells_a_key_from_a_ball_at_init():
    """MiniGrid's key and ball differ by one in their object index: at initialization the
    features of two views that differ only there are far apart (no / 255 to shrink them)."""
    torch.manual_seed(0)
    enc = FlatImageEncoder((7, 7, 3), 64)
    key = torch.ones(1, 7, 7, 3, dtype=torch.uint8)
    key[0, 3, 5] = torch.tensor([5, 1, 0], dtype=torch.uint8)  # a green key
    ball = key.clone()
    ball[0, 3, 5, 0] = 6  # a green ball
    with torch.no_grad():
        assert float((enc(key) - enc(ball)).norm()) > 0.5


def test_flat_encoder_checks_its_shapes():
    with pytest.raises(ValueError, match=r"FlatImageEncoder: expected shape \(H, W, C\)"):
        FlatImageEncoder((7, 7), 8)
    enc = FlatImageEncoder((7, 7, 3), 8)
    with pytest.raises(ValueError, match=r"expected images \[\*B, 7, 7, 3\].*\[4, 3, 7, 7\]"):
        enc(torch.zeros(4, 3, 7, 7, dtype=torch.uint8))


def test_the_registry_is_the_cli_choices_and_builds_each_encoder():
    assert list(IMAGE_ENCODERS) == ["cnn", "flat", "onehot"]
    assert isinstance(image_encoder("cnn", (7, 7, 3), 8), ImageEncoder)
    assert isinstance(InputEncoder((7, 7, 3), 8, "flat").image, FlatImageEncoder)
    assert parse_train("--image-encoder", "flat").model.image_encoder == "flat"
    assert parse_train().model.image_encoder == "cnn"
    with pytest.raises(SystemExit):
        parse_train("--image-encoder", "vit")
    assert parse_train("--image-encoder", "onehot").model.image_encoder == "onehot"
    assert isinstance(image_encoder("onehot", (7, 7, 3), 8), OneHotImageEncoder)
    with pytest.raises(ValueError, match=r"expected one of \['cnn', 'flat', 'onehot'\].*Fix"):
        image_encoder("vit", (7, 7, 3), 8)
    with pytest.raises(ValueError, match=r"image_encoder must be one of \('cnn', 'flat', 'on"):
        ModelConfig(image_encoder="vit")


def test_onehot_encoder_is_a_linear_layer_over_the_one_hot_entries():
    """Each (entry, value) has its own row: the output is the linear layer of the one-hot
    encoding of every entry (147 x 16 inputs), computed by lookups; gradients reach only the
    rows of the values seen."""
    torch.manual_seed(0)
    enc = OneHotImageEncoder((7, 7, 3), 16)
    pixels = torch.randint(0, 11, (4, 7, 7, 3), dtype=torch.uint8)
    one_hot = torch.nn.functional.one_hot(pixels.long(), 16).reshape(4, -1).float()
    torch.testing.assert_close(enc(pixels), torch.relu(one_hot @ enc.table + enc.bias))
    seq = torch.randint(0, 11, (2, 5, 7, 7, 3), dtype=torch.uint8)
    out = enc(seq)
    assert out.shape == (2, 5, 16)
    torch.testing.assert_close(out[1, 3], enc(seq[1, 3]))
    enc(pixels[:1]).sum().backward()
    used = one_hot[0].bool()
    assert (enc.table.grad[~used] == 0).all() and (enc.table.grad[used] != 0).any()
    assert sum(p.numel() for p in enc.parameters()) == 147 * 16 * 16 + 16


def test_onehot_encoder_gradients_equal_the_one_hot_linear_layers():
    """The CPU backward (a matmul per value present) gives the gradients of the linear layer
    over the one-hot view, as torch's embedding_bag backward does (the path without it:
    no grad on the table)."""
    torch.manual_seed(1)
    enc = OneHotImageEncoder((7, 7, 3), 16)
    pixels = torch.randint(0, 11, (2, 5, 7, 7, 3), dtype=torch.uint8)
    weights = torch.randn(2, 5, 16)
    (enc(pixels) * weights).sum().backward()
    table = enc.table.detach().clone().requires_grad_(True)
    bias = enc.bias.detach().clone().requires_grad_(True)
    one_hot = torch.nn.functional.one_hot(pixels.long(), 16).reshape(2, 5, -1).float()
    (torch.relu(one_hot @ table + bias) * weights).sum().backward()
    torch.testing.assert_close(enc.table.grad, table.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(enc.bias.grad, bias.grad)
    enc.table.requires_grad_(False)  # the other path: embedding_bag alone
    out = enc(pixels)
    torch.testing.assert_close(out, torch.relu(one_hot @ table + bias).detach())


def test_onehot_encoder_keeps_objects_apart_whatever_their_indices():
    """A key (5) and a ball (6) differ by one index, a key and a wall (2) by three: through
    the one-hot encoder both pairs are about equally far apart (the flat encoder puts the
    ball three times closer to the key than the wall)."""
    torch.manual_seed(0)
    enc = OneHotImageEncoder((7, 7, 3), 64)
    key = torch.ones(1, 7, 7, 3, dtype=torch.uint8)
    key[0, 3, 5] = torch.tensor([5, 1, 0], dtype=torch.uint8)
    ball, wall = key.clone(), key.clone()
    ball[0, 3, 5, 0], wall[0, 3, 5, 0] = 6, 2
    with torch.no_grad():
        near, far = float((enc(key) - enc(ball)).norm()), float((enc(key) - enc(wall)).norm())
    assert near > 0.5 and 0.5 < near / far < 2.0


def test_onehot_encoder_refuses_what_it_cannot_encode():
    with pytest.raises(ValueError, match=r"OneHotImageEncoder: expected shape \(H, W, C\)"):
        OneHotImageEncoder((7, 7), 8)
    with pytest.raises(ValueError, match="num_values must be >= 2"):
        OneHotImageEncoder((7, 7, 3), 8, num_values=1)
    enc = OneHotImageEncoder((7, 7, 3), 8)
    with pytest.raises(ValueError, match=r"expected images \[\*B, 7, 7, 3\]"):
        enc(torch.zeros(4, 3, 7, 7, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"every entry must lie in \[0, 16\), received "
                       r"values in \[0, 200\]. Fix: a larger num_values"):  # fmt: skip
        enc(torch.full((2, 7, 7, 3), 200, dtype=torch.uint8).index_fill_(0, torch.tensor([0]), 0))
    with pytest.raises(ValueError, match="expected integer entries"):
        enc(torch.zeros(2, 7, 7, 3))


@pytest.mark.parametrize("vector", [4, 0])
def test_add_image_encoder_builds_the_kind_asked_for(vector):
    mods, key, size = add_image_encoder([], ObsInputs(vector, (7, 7, 3)), "obs", "enc", 8, "flat")
    assert (key, size) == ("enc", vector + 8)
    assert [type(m) for m in mods[0].module.modules()].count(FlatImageEncoder) == 1


@pytest.mark.parametrize(
    ("memory", "kind"), [("lstm", "flat"), ("none", "flat"), ("gru", "onehot")]
)
def test_actor_critic_and_q_network_with_a_grid_encoder(memory, kind):
    cfg = ModelConfig(memory=memory, hidden_size=8, image_encoder=kind)
    model = ActorCritic(cfg, ObsInputs(4, (7, 7, 3)), 7)
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(IMAGE_ENCODERS[kind]) == 1 and ImageEncoder not in kinds  # shared
    td = TensorDict(
        observation=torch.randn(5, 6, 4),
        pixels=torch.randint(0, 11, (5, 6, 7, 7, 3), dtype=torch.uint8),
        is_init=torch.zeros(5, 6, 1, dtype=torch.bool).index_fill_(1, torch.tensor([0]), True),
        batch_size=[5, 6],
    )
    out = model.policy()(td[:, 0].clone())
    assert out["encoded_observation"].shape == (5, 12) and out["action"].shape == (5,)
    with set_recurrent_mode(True):
        assert model.actor(td.clone())["logits"].shape == (5, 6, 7)
        assert model.critic(td.clone())["state_value"].shape == (5, 6, 1)
    q = QNetwork(cfg, ObsInputs(4, (7, 7, 3)), 7)
    assert [type(m) for m in q.modules()].count(IMAGE_ENCODERS[kind]) == 1
    with set_recurrent_mode(True):
        assert q.q(td.clone())["action_value"].shape == (5, 6, 7)
