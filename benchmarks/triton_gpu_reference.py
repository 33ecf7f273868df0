"""The reference library's triton backend on the shapes of ``triton_gpu.py`` (CUDA only).

Times forward+backward and peak memory of TorchRL's fused kernels (``lstm_triton`` /
``gru_triton`` of ``torchrl.modules.tensordict_module._rnn_triton``, what its
``recurrent_backend="triton"`` calls) with cuDNN without resets in the same process as the
anchor, so that its rows compare with ours through the ratio to cuDNN as well as in
milliseconds. Same shapes, 3% resets, precision modes and recompute setting as
``triton_gpu.py``. It runs in its own process because that library pins another tensordict
than recurrl; it imports nothing of recurrl.

A sanity line per shape checks the call: without resets the reference kernel must give
cuDNN's output (both TF32 off).

Its kernels autotune on their first call, and at these hidden sizes each configuration takes
seconds to compile, one after the other: the first shape alone did not finish in 120 s.
``--warm K`` compiles, without timing anything, only the K-th configuration that survives
each kernel's own pruning; running ``--warm 0`` ... ``--warm 7`` as parallel processes fills
triton's on-disk cache on every core, after which the timed run's autotuning (which still
benchmarks every configuration and keeps the fastest, as the library does) finds each
compiled kernel in the cache.

Run (with torchrl and its dependencies importable):
``python benchmarks/triton_gpu_reference.py [--rounds N] [--cells lstm gru] [--shapes 0 1]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu import F_IN, RESET_P, SHAPES, Rows, drop_failing, peak_memory, synced
from _timing import compare

VARIANTS = {
    "ref/ieee": {"input_precision": "ieee"},
    "ref/tf32": {"input_precision": "tf32"},
    "ref/tf32x3": {"input_precision": "tf32x3"},
    "ref/bf16": {"compute_dtype": torch.bfloat16},
    "ref/full": {"input_precision": "tf32x3", "recompute": True},
}


def make_step(mode: str, batch: int, steps: int, hidden: int, name: str, reset_p=RESET_P, **kw):
    """A closure running forward+backward once (same seeds and data as triton_gpu.py)."""
    from torchrl.modules.tensordict_module._rnn_triton import gru_triton, lstm_triton

    gen = torch.Generator(device="cuda").manual_seed(0)
    torch.manual_seed(0)
    rnn_cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
    rnn = rnn_cls(F_IN, hidden, batch_first=True).cuda()
    n_states = 2 if mode == "lstm" else 1
    x = torch.randn(batch, steps, F_IN, device="cuda", generator=gen).requires_grad_(True)
    states = [
        (0.1 * torch.randn(batch, steps, hidden, device="cuda", generator=gen)).requires_grad_(True)
        for _ in range(n_states)
    ]
    is_init = torch.rand(batch, steps, device="cuda", generator=gen) < reset_p
    weights = list(rnn._flat_weights)
    leaves = [x, *states, *weights]

    if name == "cudnn":

        def run() -> list[torch.Tensor]:
            y, _ = rnn(x)
            return [y, *torch.autograd.grad(y.sum(), [x, *weights])]

        return run

    def run() -> list[torch.Tensor]:
        if mode == "lstm":
            h, c, _, _ = lstm_triton(x, *states, *weights, is_init, **kw)
            loss = h.sum() + c.sum()
        else:
            h, _ = gru_triton(x, *states, *weights, is_init, **kw)
            loss = h.sum()
        return [h, *torch.autograd.grad(loss, leaves)]

    return run


def sanity(mode: str, batch: int, steps: int, hidden: int) -> float:
    """Largest relative deviation of the reference kernel from cuDNN without resets, with
    zero stored states (what cuDNN starts from), TF32 off in both."""
    from torchrl.modules.tensordict_module._rnn_triton import gru_triton, lstm_triton

    torch.manual_seed(0)
    rnn = (torch.nn.LSTM if mode == "lstm" else torch.nn.GRU)(F_IN, hidden, batch_first=True)
    rnn = rnn.cuda()
    x = torch.randn(batch, steps, F_IN, device="cuda")
    zeros = torch.zeros(batch, steps, hidden, device="cuda")
    is_init = torch.zeros(batch, steps, dtype=torch.bool, device="cuda")
    w = list(rnn._flat_weights)
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            want, _ = rnn(x)
            if mode == "lstm":
                got = lstm_triton(x, zeros, zeros, *w, is_init, input_precision="ieee")[0]
            else:
                got = gru_triton(x, zeros, *w, is_init, input_precision="ieee")[0]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
    return ((got - want).abs().max() / want.abs().max()).item()


def only_config(index: int) -> None:
    """Make each autotuned kernel of the reference keep only the ``index``-th configuration
    its own pruning leaves (the last one when there are fewer), so that a warm-up process
    compiles one configuration per kernel."""
    from torchrl.modules.tensordict_module import _rnn_triton
    from triton.runtime.autotuner import Autotuner

    for kernel in vars(_rnn_triton).values():
        if not isinstance(kernel, Autotuner):
            continue
        prune = kernel.early_config_prune or (lambda configs, named_args, **kw: configs)

        def pick(configs, named_args, _prune=prune, **kw):
            kept = _prune(configs, named_args, **kw)
            return [kept[min(index, len(kept) - 1)]]

        kernel.early_config_prune = pick


def warm(variants: list[str], cells: list[str], shapes: list[tuple[int, int, int]]) -> None:
    """Call each variant once per cell and shape (compiling), timing nothing."""
    for mode in cells:
        for batch, steps, hidden in shapes:
            for name in variants:
                try:
                    make_step(mode, batch, steps, hidden, name, **VARIANTS[name])()
                except Exception as err:
                    print(f"warm {mode} {batch} {steps} {hidden} {name}: {err}", flush=True)
    torch.cuda.synchronize()


def run(
    rounds: int, variants: list[str], cells: list[str], shapes: list[tuple[int, int, int]]
) -> list[str]:
    header = ("mode", "B", "T", "H", "backend", "ms", "MiB", "/cudnn", "mem/cudnn")
    rows = Rows()
    rows.append("{:5} {:>4} {:>4} {:>4}  {:14} {:>8} {:>8} {:>7} {:>9}".format(*header))
    for mode in cells:
        for batch, steps, hidden in shapes:
            fns = {"cudnn": make_step(mode, batch, steps, hidden, "cudnn")}
            for name in variants:
                fns[name] = make_step(mode, batch, steps, hidden, name, **VARIANTS[name])
            drop_failing(fns, rows, f"{mode:5} {batch:4d} {steps:4d} {hidden:4d}")
            times = compare({name: synced(fn) for name, fn in fns.items()}, rounds=rounds)
            mem = {name: peak_memory(fn) for name, fn in fns.items()}
            for name in fns:
                rows.append(
                    f"{mode:5} {batch:4d} {steps:4d} {hidden:4d}  {name:14} "
                    f"{times[name] * 1e3:8.2f} {mem[name]:8.1f} "
                    f"{times[name] / times['cudnn']:7.2f} {mem[name] / mem['cudnn']:9.2f}"
                )
    # last: in IEEE precision it autotunes and compiles the kernels once more
    for mode in cells:
        for batch, steps, hidden in shapes:
            try:
                dev = f"{sanity(mode, batch, steps, hidden):.1e}"
            except Exception as err:
                dev = f"FAILED: {type(err).__name__}: {err}"
            rows.append(
                f"{mode:5} {batch:4d} {steps:4d} {hidden:4d}  sanity: reference vs cuDNN "
                f"without resets {dev}"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=list(VARIANTS),
        help="which of the reference's modes to time (its first call autotunes each)",
    )
    parser.add_argument("--cells", nargs="+", choices=["lstm", "gru"], default=["lstm", "gru"])
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=int,
        choices=range(len(SHAPES)),
        default=list(range(len(SHAPES))),
        help=f"indices into {SHAPES} (B, T, H)",
    )
    parser.add_argument(
        "--warm",
        type=int,
        metavar="K",
        help="only compile the K-th configuration of each kernel (no timing): see above",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/triton_gpu_reference.py needs a CUDA device.")
    try:
        import torchrl
    except ImportError as err:
        sys.exit(f"benchmarks/triton_gpu_reference.py needs torchrl ({err}).")
    shapes = [SHAPES[i] for i in args.shapes]
    if args.warm is not None:
        only_config(args.warm)
        warm(args.variants, args.cells, shapes)
        return
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, torchrl {torchrl.__version__}"
    )
    run(args.rounds, args.variants, args.cells, shapes)  # rows are printed as they come


if __name__ == "__main__":
    main()
