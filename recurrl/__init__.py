"""recurrl: recurrent, memory-based reinforcement learning on TensorDicts."""

__version__ = "0.1.0"
