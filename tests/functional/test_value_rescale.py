"""R2D2's value rescaling h and its inverse: the identity both ways, at every magnitude."""

from __future__ import annotations

import pytest
import torch

from recurrl.functional import signed_hyperbolic, signed_parabolic


def _magnitudes(dtype: torch.dtype, top: int = 30) -> torch.Tensor:
    x = torch.logspace(-30, top, 241, dtype=dtype)
    return torch.cat([-x.flip(0), torch.zeros(1, dtype=dtype), x])


@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float64, 1e-14), (torch.float32, 1e-6)])
@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.0])
def test_inverse_identity_both_ways(dtype, rtol, eps):
    x = _magnitudes(dtype, top=30 if eps else 18)
    torch.testing.assert_close(signed_parabolic(signed_hyperbolic(x, eps), eps), x,
                               rtol=rtol, atol=0)  # fmt: skip
    y = _magnitudes(dtype, top=25 if eps else 9)  # h's range: |h(x)| ~ eps |x| for large x
    torch.testing.assert_close(signed_hyperbolic(signed_parabolic(y, eps), eps), y,
                               rtol=rtol, atol=0)  # fmt: skip


def test_matches_the_closed_forms():
    x = torch.linspace(-1e4, 1e4, 2001, dtype=torch.float64)
    eps = 1e-3
    h = torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x
    torch.testing.assert_close(signed_hyperbolic(x), h, rtol=1e-12, atol=1e-12)
    root = (torch.sqrt(1 + 4 * eps * (x.abs() + 1 + eps)) - 1) / (2 * eps)
    torch.testing.assert_close(signed_parabolic(x), torch.sign(x) * (root**2 - 1),
                               rtol=1e-9, atol=1e-9)  # fmt: skip


def test_shape_monotone_odd_and_gradient():
    x = torch.linspace(-50, 50, 1001, requires_grad=True)
    y = signed_hyperbolic(x)
    assert (y.diff() > 0).all() and torch.equal(signed_hyperbolic(-x.detach()), -y.detach())
    y.sum().backward()
    torch.testing.assert_close(x.grad[500], torch.tensor(0.5 + 1e-3))  # slope at 0
    assert torch.isfinite(x.grad).all()
    assert signed_hyperbolic(torch.zeros(2, 3)).shape == (2, 3)


def test_bad_epsilon():
    with pytest.raises(ValueError, match="epsilon"):
        signed_hyperbolic(torch.ones(1), epsilon=-1.0)
    with pytest.raises(ValueError, match="epsilon"):
        signed_parabolic(torch.ones(1), epsilon=True)
