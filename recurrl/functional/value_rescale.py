"""R2D2's invertible value rescaling ``h`` and its inverse.

``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018, "Observe and Look
Further", arXiv:1805.11593; used by R2D2, Kapturowski et al. 2019) compresses large returns
so that one network can regress values of very different scales; ``h^-1`` is its exact
inverse. Names follow the reference library's ``signed_hyperbolic`` (``h``) and
``signed_parabolic`` (``h^-1``).

Both are written without the subtractions that lose digits near 0 in float32
(``sqrt(a + 1) - 1 = a / (sqrt(a + 1) + 1)``, and the root of ``h^-1`` taken in the form
that never subtracts two nearly equal numbers), so ``h^-1(h(x))`` returns ``x`` to float
rounding from ``1e-30`` to ``1e30``.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["signed_hyperbolic", "signed_parabolic"]


def _check_eps(epsilon: float, owner: str) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
        raise ValueError(
            f"{owner}: expected epsilon to be a number >= 0, received {epsilon!r}; fix: "
            "epsilon=1e-3 (R2D2)."
        )
    return float(epsilon)


def signed_hyperbolic(value: Tensor, epsilon: float = 1e-3) -> Tensor:
    """R2D2's value rescaling ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + epsilon x``.

    Odd, increasing, ``h(0) = 0``, slope 1/2 + epsilon at 0 and ~``sqrt(|x|)`` for large
    ``|x|``; the ``epsilon x`` term keeps the inverse Lipschitz.

    Args:
        value: any shape, floating dtype.
        epsilon: the linear term's weight (default ``1e-3``, as R2D2).

    Returns:
        ``h(value)``, same shape, dtype and device.

    Examples:
        >>> import torch
        >>> signed_hyperbolic(torch.tensor([-100.0, 0.0, 3.0]))
        tensor([-9.1499,  0.0000,  1.0030])
        >>> x = torch.tensor([-1e6, -0.5, 1e-7, 42.0], dtype=torch.float64)
        >>> torch.allclose(signed_parabolic(signed_hyperbolic(x)), x, rtol=1e-12, atol=0)
        True
    """
    eps = _check_eps(epsilon, "signed_hyperbolic")
    mag = value.abs()
    # sqrt(|x| + 1) - 1 written as |x| / (sqrt(|x| + 1) + 1): no cancellation near 0
    return value.sign() * mag / ((mag + 1).sqrt() + 1) + eps * value


def signed_parabolic(value: Tensor, epsilon: float = 1e-3) -> Tensor:
    """The exact inverse of :func:`signed_hyperbolic`: ``h^-1(h(x)) = x``.

    With ``y = |value|`` and ``u = sqrt(z + 1) - 1`` for the answer's magnitude ``z``,
    ``h(z) = y`` reads ``epsilon u^2 + (1 + 2 epsilon) u - y = 0``, whose root is taken as
    ``u = 2 y / (1 + 2 epsilon + sqrt((1 + 2 epsilon)^2 + 4 epsilon y))`` (no cancellation),
    then ``h^-1 = sign(value) u (u + 2)``. Equal to the usual closed form
    ``sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``.

    Args:
        value: any shape, floating dtype.
        epsilon: as given to :func:`signed_hyperbolic` (default ``1e-3``).

    Returns:
        ``h^-1(value)``, same shape, dtype and device.

    Examples:
        >>> import torch
        >>> signed_parabolic(torch.tensor([-9.1499, 0.0, 1.003]))
        tensor([-100.0005,    0.0000,    3.0000])
        >>> signed_parabolic(torch.tensor([2.0]), epsilon=0.0)  # (2 + 1)^2 - 1
        tensor([8.])
    """
    eps = _check_eps(epsilon, "signed_parabolic")
    mag = value.abs()
    b = 1 + 2 * eps
    u = 2 * mag / (b + (b * b + 4 * eps * mag).sqrt())
    return value.sign() * u * (u + 2)
