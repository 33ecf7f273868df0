"""TensorDict modules for recurrent policies."""

from recurrl.functional.precision import (
    RecurrentMatmulPrecision,
    RecurrentMatmulPrecisionUserMode,
    get_recurrent_matmul_precision,
    set_recurrent_matmul_precision,
)
from recurrl.functional.rnn import GRU, LSTM, GRUCell, LSTMCell
from recurrl.modules.gru import GRUModule
from recurrl.modules.lstm import LSTMModule
from recurrl.modules.lstm_net import LSTMNet
from recurrl.modules.mlp import MLP
from recurrl.modules.recurrent import RecurrentModule
from recurrl.modules.recurrent_mode import recurrent_mode, set_recurrent_mode
from recurrl.modules.utils import get_env_transforms_from_module, get_primers_from_module

__all__ = [
    "GRU",
    "LSTM",
    "MLP",
    "GRUCell",
    "GRUModule",
    "LSTMCell",
    "LSTMModule",
    "LSTMNet",
    "RecurrentMatmulPrecision",
    "RecurrentMatmulPrecisionUserMode",
    "RecurrentModule",
    "get_env_transforms_from_module",
    "get_primers_from_module",
    "get_recurrent_matmul_precision",
    "recurrent_mode",
    "set_recurrent_matmul_precision",
    "set_recurrent_mode",
]
