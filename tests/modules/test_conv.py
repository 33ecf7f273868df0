"""Tests of recurrl.modules.conv: ConvNet against hand-built nn.Sequential stacks."""

import pytest
import torch
from torch import nn

from recurrl.modules import ConvNet, SquashDims, Squeeze2dLayer


def _copy_weights(net: nn.Module, reference: nn.Sequential) -> None:
    reference.load_state_dict(net.state_dict())


def test_layers_and_outputs_match_a_hand_built_stack():
    torch.manual_seed(0)
    net = ConvNet(
        in_features=3,
        num_cells=[4, 6, 8],
        kernel_sizes=[3, (2, 3), 1],
        strides=[1, 2, 1],
        paddings=[1, 0, 0],
        activation_class=nn.ReLU,
    )
    reference = nn.Sequential(
        nn.Conv2d(3, 4, 3, stride=1, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 6, (2, 3), stride=2, padding=0),
        nn.ReLU(),
        nn.Conv2d(6, 8, 1, stride=1, padding=0),
        nn.ReLU(),
        nn.Flatten(-3, -1),  # SquashDims(ndims_in=3)
    )
    assert [type(m) for m in net] == [*[type(m) for m in reference][:-1], SquashDims]
    _copy_weights(net, reference)
    x = torch.randn(5, 3, 12, 13)
    torch.testing.assert_close(net(x), reference(x), rtol=0, atol=0)
    assert net.out_features == 8 and net.depth == 3


def test_defaults_are_the_references():
    net = ConvNet(in_features=2)
    convs = [m for m in net if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 32, 32]
    assert all(c.kernel_size == (3, 3) and c.stride == (1, 1) for c in convs)
    assert all(c.padding == (0, 0) for c in convs)
    assert sum(isinstance(m, nn.ELU) for m in net) == 3
    assert isinstance(net[-1], SquashDims) and net[-1].ndims_in == 3
    assert net(torch.zeros(2, 9, 9)).shape == (32 * 3 * 3,)


def test_lazy_input_channels_and_tutorial_configuration():
    net = ConvNet(
        num_cells=[32, 32, 64],
        squeeze_output=True,
        aggregator_class=nn.AdaptiveAvgPool2d,
        aggregator_kwargs={"output_size": (1, 1)},
    )
    assert isinstance(net[0], nn.LazyConv2d)
    x = torch.randn(1, 20, 20)
    out = net(x)  # an unbatched env's frame: [C, H, W] -> [64]
    assert out.shape == (64,)
    assert net[0].weight.shape == (32, 1, 3, 3)
    # the same computed by hand from the materialized layers
    h = x
    for module in net[:-2]:
        h = module(h)
    torch.testing.assert_close(out, h.mean((-1, -2)))


def test_leading_batch_dims_are_flattened_and_restored():
    torch.manual_seed(0)
    net = ConvNet(in_features=1, num_cells=[4], kernel_sizes=3)
    x = torch.randn(2, 3, 1, 6, 6)
    out = net(x)
    assert out.shape == (2, 3, 4 * 4 * 4)
    torch.testing.assert_close(out, net(x.reshape(6, 1, 6, 6)).reshape(2, 3, -1))


def test_bias_last_layer_and_per_layer_kwargs():
    net = ConvNet(
        in_features=1,
        num_cells=[2, 2],
        bias_last_layer=False,
        activation_class=nn.LeakyReLU,
        activation_kwargs=[{"negative_slope": 0.1}, {"negative_slope": 0.3}],
        norm_class=nn.BatchNorm2d,
        norm_kwargs={"num_features": 2},
    )
    convs = [m for m in net if isinstance(m, nn.Conv2d)]
    assert convs[0].bias is not None and convs[1].bias is None
    slopes = [m.negative_slope for m in net if isinstance(m, nn.LeakyReLU)]
    assert slopes == [0.1, 0.3]
    assert sum(isinstance(m, nn.BatchNorm2d) for m in net) == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_cells": [4, 4], "kernel_sizes": [3, 3, 3]}, "kernel_sizes has 3 entries"),
        ({"num_cells": [4, 4], "depth": 3}, "num_cells has 2 entries"),
        ({"depth": 0}, "depth >= 1"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConvNet(**kwargs)


def test_squeeze_refuses_a_non_singleton_dim():
    net = ConvNet(in_features=1, num_cells=[2], aggregator_class=None, squeeze_output=True)
    with pytest.raises(ValueError, match="last two dims to be of size 1"):
        net(torch.zeros(1, 5, 5))
    assert Squeeze2dLayer()(torch.zeros(3, 2, 1, 1)).shape == (3, 2)


def test_input_without_image_dims_raises():
    with pytest.raises(ValueError, match=r"\[\*B, C, H, W\]"):
        ConvNet(in_features=1)(torch.zeros(4, 4))
