"""What differs between the tensordict releases recurrl supports (``>=0.14.3,<0.16``).

The one place that knows: the rest of recurrl imports these names from here, so supporting
the oldest release (0.14.3, what torchrl 0.14.1 requires) adds no version checks elsewhere.
Each entry names the release that changed it. CI runs the suite on the newest release
(``constraints-dev.txt``) and a subset on the oldest (``.ci/torchrl``,
``constraints-torchrl.txt``).

* ``interaction_type``: re-exported by ``tensordict.nn`` from 0.15 on; 0.14.x defines it
  in ``tensordict.nn.probabilistic`` only (where 0.15.x still has it).

Examples:
    >>> from recurrl._compat import interaction_type
    >>> interaction_type() is None  # no set_interaction_type block open
    True
"""

from __future__ import annotations

from tensordict.nn.probabilistic import interaction_type

__all__ = ["interaction_type"]
