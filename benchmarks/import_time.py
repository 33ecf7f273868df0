"""Import time of recurrl in a fresh process against ``import tensordict``.

Each candidate is imported in a new interpreter (``python -c "import X"``), interleaved
round by round, and the median wall time over the rounds is reported with the ratio to
``import tensordict`` (which itself imports torch). ``import recurrl`` loads its subpackages
lazily; ``import recurrl.modules`` / ``recurrl.envs`` / ``recurrl.collectors`` are what a
script using the recurrent stack pays.

Run: ``python benchmarks/import_time.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CANDIDATES = [
    "tensordict",
    "recurrl",
    "recurrl.modules",
    "recurrl.envs",
    "recurrl.collectors",
    "recurrl.trainers",
]


def one(module: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    one("tensordict")  # warm the file cache
    times: dict[str, list[float]] = {m: [] for m in CANDIDATES}
    for _ in range(args.rounds):
        for module in CANDIDATES:
            times[module].append(one(module))
    base = statistics.median(times["tensordict"])
    print(f"python {sys.version.split()[0]}, {args.rounds} rounds, fresh process each")
    for module in CANDIDATES:
        med = statistics.median(times[module])
        print(f"import {module:<20} {med * 1000:8.0f} ms  {med / base:5.2f}x tensordict")


if __name__ == "__main__":
    main()
