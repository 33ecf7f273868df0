"""One sequential-mode step of LSTMModule/GRUModule on a TensorDict against torch cells.

Batch [8], F=16, H=64: the reference is ``nn.LSTMCell``/``nn.GRUCell`` on plain tensors
(no TensorDict, no reset handling), i.e. the floor for one collection step.

Every call resets one of the 8 rows (``is_init[0]`` True), so the modules mask their states
each time; the ``no reset`` lines repeat the comparison with ``is_init`` all False (the
modules then skip the masking).

The ``cpp`` column is the same module built with ``recurrent_backend="cpp"``, whose step is
one C++ operator (``recurrl/functional/recurrent/cpp_step.py``: reset, gates and new states);
it is left out, with the reason, where the C++ extension cannot be built. A CPU module built
with ``recurrent_backend="auto"`` (what ``recurrl train`` builds) steps through the same
operator where the extension builds: the ``cpp`` column is its figure too.

Run: ``python benchmarks/single_step.py [--threads N] [--clock thread]``

``--clock thread`` times with the CPU time of the calling thread instead of wall time: on a
machine shared with other jobs it leaves out the time they take the core away (the calls are
too small for torch to run them on several threads).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl._ext import extension_unavailable_reason, load_extension
from recurrl.modules import GRUModule, LSTMModule

B, F, H = 8, 16, 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    print(
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, B={B} F={F} H={H}, "
        f"clock={args.clock}"
    )
    cpp_reason = extension_unavailable_reason()
    if cpp_reason is None:
        load_extension()  # compiled before timing (once, ~1 min)
    else:
        print(f"cpp column left out: the C++ extension cannot be built here ({cpp_reason})")
    torch.manual_seed(0)
    x = torch.randn(B, F)
    reset = torch.zeros(B, 1, dtype=torch.bool)
    reset[0] = True
    with torch.no_grad():
        for (kind, label), is_init in zip(
            [(k, lbl) for lbl in ("", " no reset") for k in ("lstm", "gru")],
            [reset, reset, torch.zeros_like(reset), torch.zeros_like(reset)],
        ):
            states = ["h", "c"] if kind == "lstm" else ["h"]
            cell = torch.nn.LSTMCell(F, H) if kind == "lstm" else torch.nn.GRUCell(F, H)
            hx = tuple(torch.randn(B, H) for _ in states)
            cls = LSTMModule if kind == "lstm" else GRUModule
            fns = {"cell": (lambda cell=cell, hx=hx: cell(x, hx if len(hx) > 1 else hx[0]))}
            variants = {"fused": {}, "python": {"python_based": True}}
            if cpp_reason is None:
                variants["cpp"] = {"recurrent_backend": "cpp"}
            for name, kwargs in variants.items():
                module = cls(
                    F,
                    H,
                    in_keys=["obs", *states],
                    out_keys=["out", *(("next", s) for s in states)],
                    **kwargs,
                )
                td = TensorDict(
                    {"obs": x, "is_init": is_init, **{s: torch.randn(B, 1, H) for s in states}},
                    batch_size=[B],
                )
                fns[name] = lambda m=module, td=td: m(td)
            times = compare(fns, rounds=9, inner=200, clock=clock)
            cell = times["cell"]
            cpp = (
                f"  cpp={times['cpp'] * 1e6:6.1f}us ({times['cpp'] / cell:.2f}x)"
                if "cpp" in times
                else ""
            )
            print(
                f"{kind.upper():4}{label} cell={cell * 1e6:6.1f}us  "
                f"module={times['fused'] * 1e6:6.1f}us ({times['fused'] / cell:.2f}x)  "
                f"python_based={times['python'] * 1e6:6.1f}us "
                f"({times['python'] / cell:.2f}x){cpp}"
            )


if __name__ == "__main__":
    main()
