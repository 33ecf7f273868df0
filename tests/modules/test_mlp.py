"""``MLP``: layer layout, lazy input, depth/num_cells, activation options and errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recurrl.modules import MLP


def _linears(mlp: MLP) -> list[nn.Module]:
    return [m for m in mlp if isinstance(m, (nn.Linear, nn.LazyLinear))]


def test_lazy_input_is_inferred_at_first_call():
    mlp = MLP(out_features=2, num_cells=[8, 6])
    assert isinstance(mlp[0], nn.LazyLinear)
    assert mlp(torch.randn(4, 5, 7)).shape == (4, 5, 2)
    assert mlp[0].weight.shape == (8, 7)
    assert mlp.in_features is None and mlp.out_features == 2


@pytest.mark.parametrize(
    ("depth", "num_cells", "widths"),
    [
        (None, None, []),
        (0, None, []),
        (None, 16, [16]),
        (3, 16, [16, 16, 16]),
        (0, 16, []),
        (None, [8, 4], [8, 4]),
        (2, [8, 4], [8, 4]),
    ],
)
def test_depth_and_num_cells(depth, num_cells, widths):
    mlp = MLP(in_features=5, out_features=3, depth=depth, num_cells=num_cells)
    layers = _linears(mlp)
    assert [layer.out_features for layer in layers] == [*widths, 3]
    assert [layer.in_features for layer in layers] == [5, *widths]
    assert sum(isinstance(m, nn.Tanh) for m in mlp) == len(widths)
    assert mlp(torch.randn(2, 5)).shape == (2, 3)


def test_layer_order_and_activation_options():
    mlp = MLP(
        in_features=4,
        out_features=2,
        num_cells=[6],
        activation_class=nn.LeakyReLU,
        activation_kwargs={"negative_slope": 0.3},
        activate_last_layer=True,
        bias_last_layer=False,
        dropout=0.1,
    )
    kinds = [type(m) for m in mlp]
    assert kinds == [nn.Linear, nn.LeakyReLU, nn.Dropout, nn.Linear, nn.LeakyReLU]
    assert mlp[1].negative_slope == 0.3 and mlp[2].p == 0.1
    assert mlp[0].bias is not None and mlp[3].bias is None


def test_matches_a_hand_written_stack():
    mlp = MLP(in_features=3, out_features=2, num_cells=[5])
    x = torch.randn(4, 3)
    expected = mlp[2](torch.tanh(mlp[0](x)))
    torch.testing.assert_close(mlp(x), expected)


def test_errors():
    with pytest.raises(ValueError, match="out_features"):
        MLP(in_features=3, num_cells=[4])
    with pytest.raises(ValueError, match="needs num_cells"):
        MLP(in_features=3, out_features=2, depth=2)
    with pytest.raises(ValueError, match="contradicts"):
        MLP(in_features=3, out_features=2, depth=3, num_cells=[4, 4])
    with pytest.raises(ValueError, match="depth"):
        MLP(in_features=3, out_features=2, depth=-1, num_cells=4)
