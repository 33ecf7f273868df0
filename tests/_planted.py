"""A pickle payload that proves code ran: the loaders under test must never unpickle it."""

from __future__ import annotations

import os


class Planted:
    """Unpickling this creates the directory ``marker``: proof that pickle ran code."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))
