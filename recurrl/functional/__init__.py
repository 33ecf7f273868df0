"""Pure tensor code: cell step functions, reset-aware unrolling, returns, precision modes.

Functions and kernels only: the networks (python-native ``LSTM``/``GRU``, ``MinGRU``, ``LRU``)
are in :mod:`recurrl.modules`. Nothing in this package imports tensordict.
"""

from recurrl.functional.cells import (
    gru_cell,
    gru_cell_from_projection,
    lstm_cell,
    lstm_cell_from_projection,
)
from recurrl.functional.linear_recurrence import linear_recurrence
from recurrl.functional.precision import (
    RecurrentMatmulPrecision,
    RecurrentMatmulPrecisionUserMode,
    get_recurrent_matmul_precision,
    resolve_recurrent_matmul_precision,
    set_recurrent_matmul_precision,
)
from recurrl.functional.priority import sequence_priority
from recurrl.functional.recurrent import (
    RECURRENT_BACKENDS,
    CellKind,
    RecurrentBackend,
    RecurrentOptions,
    RNNConfig,
    recurrent_unroll,
    register_cell_kind,
    register_recurrent_backend,
    resolve_backend,
)
from recurrl.functional.returns import (
    generalized_advantage_estimate,
    td0_return_estimate,
    td_lambda_return_estimate,
)
from recurrl.functional.sequences import segment_starts, split_pieces, trajectory_ends
from recurrl.functional.value_rescale import signed_hyperbolic, signed_parabolic

__all__ = [
    "RECURRENT_BACKENDS",
    "CellKind",
    "RNNConfig",
    "RecurrentBackend",
    "RecurrentMatmulPrecision",
    "RecurrentMatmulPrecisionUserMode",
    "RecurrentOptions",
    "generalized_advantage_estimate",
    "get_recurrent_matmul_precision",
    "gru_cell",
    "gru_cell_from_projection",
    "linear_recurrence",
    "lstm_cell",
    "lstm_cell_from_projection",
    "recurrent_unroll",
    "register_cell_kind",
    "register_recurrent_backend",
    "resolve_backend",
    "resolve_recurrent_matmul_precision",
    "segment_starts",
    "sequence_priority",
    "set_recurrent_matmul_precision",
    "signed_hyperbolic",
    "signed_parabolic",
    "split_pieces",
    "td0_return_estimate",
    "td_lambda_return_estimate",
    "trajectory_ends",
]
