"""``python -m recurrl``: the ``recurrl`` command (see :mod:`recurrl.trainers.cli`)."""

import sys

from recurrl.trainers.cli import main

if __name__ == "__main__":
    sys.exit(main())
