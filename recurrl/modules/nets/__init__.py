"""Networks over plain tensors, wrapped by the TensorDict modules of :mod:`recurrl.modules`.

Python-native :class:`LSTMCell`, :class:`GRUCell`, :class:`LSTM` and :class:`GRU` (drop-ins for
their :mod:`torch.nn` namesakes), and :class:`MinGRU` and :class:`LRU`, the networks of the
linear-recurrent cell kinds. All are exported by :mod:`recurrl.modules`.
"""

from recurrl.modules.nets.linear import LRU, MinGRU
from recurrl.modules.nets.rnn import GRU, LSTM, GRUCell, LSTMCell
from recurrl.modules.nets.transformer import GatedTransformer

__all__ = ["GRU", "LRU", "LSTM", "GRUCell", "GatedTransformer", "LSTMCell", "MinGRU"]
