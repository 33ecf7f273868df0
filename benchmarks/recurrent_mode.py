"""Recurrent-mode forward+backward of LSTMModule/GRUModule against plain torch RNNs.

B=32 sequences of T=64 steps, F=16 input features, H in {64, 256}; resets: none, or random
with mean episode length 16 and 4. The state stored at a restart inside a row is either zero
(``restart=zero``: what a collector stores, since the primer writes zeros at every episode
start; the ``[B, T]`` batches PPO trains on) or random (``restart=random``: a slice sampled
mid-episode, as in the flat output of ``SliceSampler``). The reference is plain
``torch.nn.LSTM``/``nn.GRU`` on the same batch WITHOUT resets (it cannot handle them): the ratio
says what honouring resets, the TensorDict plumbing and the backend cost on top of the fused
torch kernel.

Backends: pad, scan, auto, and cpp where a C++ compiler can build its kernels.

Run: ``python benchmarks/recurrent_mode.py [--threads N] [--cpu-time] [--hidden H ...] [--steps T]``
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

from recurrl._ext import extension_unavailable_reason
from recurrl.functional.recurrent import RNNConfig
from recurrl.functional.recurrent.pad.flush import flush_unroll
from recurrl.functional.recurrent.pad.frozen import frozen_unroll
from recurrl.functional.sequences import split_pieces
from recurrl.modules import GRUModule, LSTMModule, set_recurrent_mode

B, T, F = 32, 64, 16


def make_batch(kind: str, hidden: int, mean_episode: int | None, restart: str) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    if mean_episode is None:
        is_init = torch.zeros(B, T, 1, dtype=torch.bool)
    else:
        is_init = torch.rand(B, T, 1, generator=g) < 1.0 / mean_episode
    data = {"obs": torch.randn(B, T, F, generator=g), "is_init": is_init}
    names = ["h", "c"] if kind == "lstm" else ["h"]
    inside = is_init.clone()
    inside[:, 0] = False
    for name in names:
        state = torch.randn(B, T, 1, hidden, generator=g) * 0.1
        if restart == "zero":
            state[inside.squeeze(-1)] = 0.0
        data[name] = state
    return TensorDict(data, batch_size=[B, T])


CASES = [(None, "random"), (16, "zero"), (16, "random"), (4, "zero"), (4, "random")]


def backends() -> tuple[str, ...]:
    """The backends timed: ``cpp`` too where its C++ kernels can be built."""
    return ("pad", "scan", "auto") + (("cpp",) if extension_unavailable_reason() is None else ())


def run(hidden_sizes: list[int], rounds: int, clock=time.perf_counter) -> list[str]:
    rows = []
    for kind in ("lstm", "gru"):
        for hidden in hidden_sizes:
            torch.manual_seed(0)
            cls, plain_cls = (
                (LSTMModule, torch.nn.LSTM) if kind == "lstm" else (GRUModule, torch.nn.GRU)
            )
            states = ["h", "c"] if kind == "lstm" else ["h"]
            modules = {
                backend: cls(
                    F,
                    hidden,
                    recurrent_backend=backend,
                    in_keys=["obs", *states],
                    out_keys=["out", *(("next", s) for s in states)],
                )
                for backend in backends()
            }
            plain = plain_cls(F, hidden, batch_first=True)
            x = torch.randn(B, T, F, requires_grad=True)

            def plain_fn(plain=plain, x=x):
                plain(x)[0].sum().backward()

            for mean_episode, restart in CASES:
                td = make_batch(kind, hidden, mean_episode, restart)
                fns = {"plain": plain_fn}
                for backend, module in modules.items():

                    def fn(module=module, td=td):
                        with set_recurrent_mode(True):
                            out = module(td.copy())
                        out["out"].sum().backward()

                    fns[backend] = fn
                times = compare(fns, rounds=rounds, clock=clock)
                resets = "none" if mean_episode is None else f"ep~{mean_episode}"
                resets += "" if mean_episode is None else f" restart={restart}"
                ratios = "  ".join(f"{b}={times[b] / times['plain']:.2f}x" for b in modules)
                rows.append(
                    f"{kind.upper():4} H={hidden:<4} resets={resets:20} "
                    f"plain={times['plain'] * 1e3:7.2f}ms  {ratios}"
                )
                print(rows[-1], flush=True)
    return rows


def _windows(cfg, weights, x, states, is_init, *, training):
    return frozen_unroll(cfg, weights, x, states, split_pieces(is_init), training=training)


def _layout(unroll, cfg, weights, obs, states, is_init):
    def fn():
        x = obs.clone().requires_grad_(True)
        y, _ = unroll(cfg, weights, x, states, is_init, training=True)
        y.sum().backward()

    return fn


def run_layouts(hidden_sizes: list[int], rounds: int, clock=time.perf_counter) -> None:
    """``pad``'s two fused layouts on restarts from zeros, the backend alone (no TensorDict).

    In training, as the modules run in the main benchmark: the LSTM's ``c`` at trajectory
    ends comes from oneDNN's workspace in the flush layout, and the windows are staggered
    where ``pad`` would stagger them.
    """
    for kind in ("lstm", "gru"):
        for hidden in hidden_sizes:
            torch.manual_seed(0)
            rnn = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(F, hidden, batch_first=True)
            weights = list(rnn._flat_weights)
            cfg = RNNConfig(kind, F, hidden)
            x_plain = torch.randn(B, T, F, requires_grad=True)
            for mean_episode in (16, 4):
                td = make_batch(kind, hidden, mean_episode, "zero")
                states = tuple(td[k] for k in (["h", "c"] if kind == "lstm" else ["h"]))
                is_init = td["is_init"].squeeze(-1)

                def plain(rnn=rnn, x=x_plain):
                    rnn(x)[0].sum().backward()

                args = (cfg, weights, td["obs"], states, is_init)
                times = compare(
                    {
                        "plain": plain,
                        "flush": _layout(flush_unroll, *args),
                        "windows": _layout(_windows, *args),
                    },
                    rounds=rounds,
                    clock=clock,
                )
                print(
                    f"{kind.upper():4} H={hidden:<4} ep~{mean_episode:<3} restart=zero  "
                    f"flush={times['flush'] / times['plain']:.2f}x  "
                    f"windows={times['windows'] / times['plain']:.2f}x",
                    flush=True,
                )


def main() -> None:
    global T
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=64, help="sequence length T (default 64)")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time CPU time instead of wall time: of the calling thread with --threads 1 "
        "(steadier on a shared machine, where other processes take the core away), of the "
        "whole process with more threads (which also counts OpenMP's waiting spins)",
    )
    parser.add_argument(
        "--layouts",
        action="store_true",
        help="instead: pad's two fused layouts (flush steps, piece-grid windows), backend alone",
    )
    args = parser.parse_args()
    T = args.steps
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, B={B} T={T} F={F}")
    clock = time.perf_counter
    if args.cpu_time:
        clock = time.thread_time if torch.get_num_threads() == 1 else time.process_time
    if args.layouts:
        run_layouts(args.hidden, args.rounds, clock)
    else:
        run(args.hidden, args.rounds, clock)


if __name__ == "__main__":
    main()
