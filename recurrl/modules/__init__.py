"""TensorDict modules for recurrent policies, and the networks they wrap.

``get_primers_from_module`` and ``get_env_transforms_from_module`` build env transforms with
the builders :mod:`recurrl.envs` registers when it is imported (see
:mod:`recurrl.modules.utils`): importing this package does not import :mod:`recurrl.envs`.
"""

# first: the built-in memories register as they are imported, and --memory lists them in
# that order (lstm, gru, lru, mingru)
from recurrl.modules.lstm import LSTMModule

# isort: split
from recurrl.functional.precision import (
    RecurrentMatmulPrecision,
    RecurrentMatmulPrecisionUserMode,
    get_recurrent_matmul_precision,
    set_recurrent_matmul_precision,
)
from recurrl.modules.conv import ConvNet, SquashDims, Squeeze2dLayer
from recurrl.modules.exploration import (
    EGreedyModule,
    ExplorationType,
    exploration_type,
    set_exploration_type,
)
from recurrl.modules.gru import GRUModule
from recurrl.modules.lru import LRU, LRUModule
from recurrl.modules.lstm_net import LSTMNet
from recurrl.modules.mingru import MinGRU, MinGRUModule
from recurrl.modules.mlp import MLP
from recurrl.modules.multiagent import MultiAgentMLP
from recurrl.modules.nets import GRU, LSTM, GRUCell, LSTMCell
from recurrl.modules.q_value import QValueModule
from recurrl.modules.recurrent import RecurrentModule
from recurrl.modules.recurrent_mode import recurrent_mode, set_recurrent_mode
from recurrl.modules.registry import MEMORY_REGISTRY, memory_names, register_memory
from recurrl.modules.transformer import TransformerModule
from recurrl.modules.utils import get_env_transforms_from_module, get_primers_from_module

__all__ = [
    "GRU",
    "LRU",
    "LSTM",
    "MEMORY_REGISTRY",
    "MLP",
    "ConvNet",
    "EGreedyModule",
    "ExplorationType",
    "GRUCell",
    "GRUModule",
    "LRUModule",
    "LSTMCell",
    "LSTMModule",
    "LSTMNet",
    "MinGRU",
    "MinGRUModule",
    "MultiAgentMLP",
    "QValueModule",
    "RecurrentMatmulPrecision",
    "RecurrentMatmulPrecisionUserMode",
    "RecurrentModule",
    "SquashDims",
    "Squeeze2dLayer",
    "TransformerModule",
    "exploration_type",
    "get_env_transforms_from_module",
    "get_primers_from_module",
    "get_recurrent_matmul_precision",
    "memory_names",
    "recurrent_mode",
    "register_memory",
    "set_exploration_type",
    "set_recurrent_matmul_precision",
    "set_recurrent_mode",
]
