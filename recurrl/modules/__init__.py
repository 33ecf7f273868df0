"""TensorDict modules for recurrent policies.

``get_primers_from_module`` and ``get_env_transforms_from_module`` are documented aliases of
:mod:`recurrl.envs`' functions (see :mod:`recurrl.modules.utils`), resolved on first access:
importing this package does not import :mod:`recurrl.envs`.
"""

from typing import TYPE_CHECKING, Any

from recurrl.functional.precision import (
    RecurrentMatmulPrecision,
    RecurrentMatmulPrecisionUserMode,
    get_recurrent_matmul_precision,
    set_recurrent_matmul_precision,
)
from recurrl.functional.rnn import GRU, LSTM, GRUCell, LSTMCell
from recurrl.modules.gru import GRUModule
from recurrl.modules.lru import LRU, LRUModule
from recurrl.modules.lstm import LSTMModule
from recurrl.modules.lstm_net import LSTMNet
from recurrl.modules.mingru import MinGRU, MinGRUModule
from recurrl.modules.mlp import MLP
from recurrl.modules.recurrent import RecurrentModule
from recurrl.modules.recurrent_mode import recurrent_mode, set_recurrent_mode

__all__ = [
    "GRU",
    "LRU",
    "LSTM",
    "MLP",
    "GRUCell",
    "GRUModule",
    "LRUModule",
    "LSTMCell",
    "LSTMModule",
    "LSTMNet",
    "MinGRU",
    "MinGRUModule",
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

if TYPE_CHECKING:
    from recurrl.modules.utils import get_env_transforms_from_module, get_primers_from_module


def __getattr__(name: str) -> Any:
    # PEP 562: the env-side aliases load recurrl.envs on first access only.
    if name in ("get_env_transforms_from_module", "get_primers_from_module"):
        from recurrl.modules import utils

        return getattr(utils, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
