"""Runnable examples: ``python -m recurrl.examples.<name>``."""
