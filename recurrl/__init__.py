"""recurrl: recurrent, memory-based reinforcement learning on TensorDicts."""

__version__ = "0.1.0"

from recurrl import _lazy_dynamo

_lazy_dynamo.install()  # torch._dynamo waits for the first compile (recurrl/_lazy_dynamo.py)
