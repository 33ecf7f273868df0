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

Run (with torchrl and its dependencies importable):
``python benchmarks/triton_gpu_reference.py [--rounds N]``
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


def run(rounds: int, variants: list[str]) -> list[str]:
    header = ("mode", "B", "T", "H", "backend", "ms", "MiB", "/cudnn", "mem/cudnn")
    rows = Rows()
    rows.append("{:5} {:>4} {:>4} {:>4}  {:14} {:>8} {:>8} {:>7} {:>9}".format(*header))
    for mode in ("lstm", "gru"):
        for batch, steps, hidden in SHAPES:
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
            try:
                dev = f"{sanity(mode, batch, steps, hidden):.1e}"
            except Exception as err:
                dev = f"FAILED: {type(err).__name__}: {err}"
            rows.append(f"  sanity: reference vs cuDNN without resets {dev}")
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
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/triton_gpu_reference.py needs a CUDA device.")
    try:
        import torchrl
    except ImportError as err:
        sys.exit(f"benchmarks/triton_gpu_reference.py needs torchrl ({err}).")
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, torchrl {torchrl.__version__}"
    )
    run(args.rounds, args.variants)  # rows are printed as they come


if __name__ == "__main__":
    main()
