"""LossModule base: recurrent mode everywhere, key management, masking helpers."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from tensordict import TensorDict

from recurrl.modules import recurrent_mode, set_recurrent_mode
from recurrl.objectives import LossModule
from recurrl.objectives.common import burn_in_mask, masked_mean, masked_normalize, step_mask


class _Probe(LossModule):
    @dataclass
    class _AcceptedKeys:
        value: str = "value"
        mask: tuple = ("collector", "mask")

    def forward(self, td):
        return TensorDict(loss_mode=torch.tensor(float(recurrent_mode())))

    def actor_loss(self):
        return recurrent_mode()

    def helper(self):
        return recurrent_mode()

    def _private_loss(self):
        return recurrent_mode()


class _Child(_Probe):
    def forward(self, td):  # overriding must not lose the wrapper
        return TensorDict(loss_mode=torch.tensor(float(recurrent_mode())))


@pytest.mark.parametrize("cls", [_Probe, _Child])
def test_forward_and_loss_methods_run_in_recurrent_mode(cls):
    loss = cls()
    assert loss(TensorDict())["loss_mode"] == 1.0
    assert loss.actor_loss() is True
    assert loss.helper() is False  # not a loss method: untouched
    assert loss._private_loss() is False
    with set_recurrent_mode(False):  # even inside an explicit sequential block
        assert loss(TensorDict())["loss_mode"] == 1.0
    assert recurrent_mode() is False  # restored afterwards


def test_set_keys():
    loss = _Probe()
    assert loss.tensor_keys.value == "value"
    assert loss.set_keys(value="v") is loss
    assert loss.tensor_keys.value == "v"
    assert _Probe().tensor_keys.value == "value"  # per instance
    with pytest.raises(ValueError, match=r"unknown key 'valu'.*\['value', 'mask'\]"):
        loss.set_keys(valu="x")


def test_masked_mean_and_normalize():
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[True, True], [True, False]])
    assert masked_mean(x, mask) == 2.0
    assert masked_mean(x, None) == x.mean()
    n = masked_normalize(x, mask)[mask]
    torch.testing.assert_close(n, (x[mask] - 2.0) / (x[mask].std(unbiased=False) + 1e-8))


def test_masked_out_steps_may_hold_nan():
    """A masked-out step is selected away, not multiplied by 0 (``0 * NaN = NaN``): its NaN
    reaches neither the statistics nor the gradient of the real steps."""
    x = torch.tensor([1.0, float("nan"), 3.0, float("inf")], requires_grad=True)
    mask = torch.tensor([True, False, True, False])
    mean = masked_mean(x, mask)
    assert mean == 2.0
    (grad,) = torch.autograd.grad(mean, x)
    assert torch.equal(grad, torch.tensor([0.5, 0.0, 0.5, 0.0]))
    torch.testing.assert_close(masked_normalize(x, mask)[mask], torch.tensor([-1.0, 1.0]))


def test_step_mask_shapes():
    td = TensorDict({("collector", "mask"): torch.ones(2, 3, 1, dtype=torch.bool)}, [2, 3])
    assert step_mask(td, ("collector", "mask")).shape == (2, 3)
    assert step_mask(TensorDict(batch_size=[2]), ("collector", "mask")) is None
    bad = TensorDict({("collector", "mask"): torch.ones(2, 4, dtype=torch.bool)}, [2])
    with pytest.raises(ValueError, match="expected shape"):
        step_mask(bad, ("collector", "mask"))


def test_burn_in_mask():
    is_init = torch.tensor([[False, False, False, True, False, False, True],
                            [False, False, False, False, False, False, False]])  # fmt: skip
    expected = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0]]).bool()
    assert torch.equal(burn_in_mask(is_init, 3), expected)
    assert not burn_in_mask(is_init, 0).any()
