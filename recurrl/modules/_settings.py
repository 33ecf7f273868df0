"""The recurrent-mode settings of a recurrent module: ``recurrent_backend``,
``recurrent_recompute``, ``recurrent_compute_dtype``, ``recurrent_matmul_precision`` and
``recurrent_options``, assignable after construction and validated together.

A mixin of :class:`~recurrl.modules.RecurrentModule`: it keeps the validated
:class:`~recurrl.functional.recurrent.RecurrentOptions` in ``self._recurrent_options`` and
reads the module's ``_mode``, ``python_based``, ``rnn`` and ``_cfg``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from recurrl.functional.recurrent import RecurrentOptions, check_recurrent_options

__all__ = ["RecurrentSettings"]


class RecurrentSettings:
    """The assignable recurrent-mode settings of a module, one validated
    :class:`~recurrl.functional.recurrent.RecurrentOptions` behind them."""

    _recurrent_options: RecurrentOptions

    def _checked(
        self, backend: str, recompute: str, compute_dtype: torch.dtype, precision: str, *,
        python_based: bool, device: torch.device | str | None, proj_size: int,
    ) -> RecurrentOptions:  # fmt: skip
        """The validated :class:`RecurrentOptions` of these settings for this module's cell,
        errors prefixed with the class name."""
        try:
            return check_recurrent_options(
                backend, recompute, python_based=python_based, device=device,
                proj_size=proj_size, mode=self._mode, compute_dtype=compute_dtype,
                matmul_precision=precision,
            )  # fmt: skip
        except ValueError as err:
            raise ValueError(f"{type(self).__name__}: {err}") from None

    def _replaced(self, **changes: Any) -> RecurrentOptions:
        """The module's options with ``changes``, validated as a whole."""
        o = replace(self._recurrent_options, **changes) if changes else self._recurrent_options
        return self._checked(
            o.backend, o.recompute, o.compute_dtype, o.matmul_precision,
            python_based=self.python_based, device=next(self.rnn.parameters()).device,
            proj_size=self._cfg.proj_size,
        )  # fmt: skip

    @property
    def recurrent_options(self) -> RecurrentOptions:
        """The recurrent-mode settings as one frozen
        :class:`~recurrl.functional.recurrent.RecurrentOptions`, forwarded unchanged to
        :func:`~recurrl.functional.recurrent.recurrent_unroll`. Assignable (validated)."""
        return self._recurrent_options

    @recurrent_options.setter
    def recurrent_options(self, value: RecurrentOptions) -> None:
        if not isinstance(value, RecurrentOptions):
            raise TypeError(
                f"{type(self).__name__}.recurrent_options must be a RecurrentOptions, "
                f"received {type(value).__name__}."
            )
        self._recurrent_options = self._replaced(**{
            f: getattr(value, f) for f in ("backend", "recompute", "compute_dtype",
                                           "matmul_precision")
        })  # fmt: skip

    @property
    def recurrent_backend(self) -> str:
        """Backend of recurrent mode (one of
        :func:`~recurrl.functional.recurrent.recurrent_backend_names`; default ``"auto"``).
        Assignable; the new value is validated together with :attr:`recurrent_recompute`."""
        return self._recurrent_options.backend

    @recurrent_backend.setter
    def recurrent_backend(self, value: str) -> None:
        self._recurrent_options = self._replaced(backend=value)

    @property
    def recurrent_recompute(self) -> str:
        """``"none"`` or ``"full"``. Assignable; validated with :attr:`recurrent_backend`."""
        return self._recurrent_options.recompute

    @recurrent_recompute.setter
    def recurrent_recompute(self, value: str) -> None:
        self._recurrent_options = self._replaced(recompute=value)

    @property
    def recurrent_compute_dtype(self) -> torch.dtype:
        """Dtype of the ``triton`` backend's recurrent matmul operands. Assignable."""
        return self._recurrent_options.compute_dtype

    @recurrent_compute_dtype.setter
    def recurrent_compute_dtype(self, value: torch.dtype) -> None:
        self._recurrent_options = self._replaced(compute_dtype=value)

    @property
    def recurrent_matmul_precision(self) -> str:
        """The ``triton`` backend's float32 matmul precision mode. Assignable."""
        return self._recurrent_options.matmul_precision

    @recurrent_matmul_precision.setter
    def recurrent_matmul_precision(self, value: str) -> None:
        self._recurrent_options = self._replaced(matmul_precision=value)
