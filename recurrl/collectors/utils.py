"""Helpers for collected data, where the reference library exports them
(``torchrl.collectors.utils``).

:func:`split_trajectories` lives in :mod:`recurrl.data.utils` (the data layer, below the
collectors, so that replay code can use it too) and is re-exported here and by
:mod:`recurrl.collectors`.
"""

from recurrl.data.utils import split_trajectories

__all__ = ["split_trajectories"]
