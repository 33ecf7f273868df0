"""Whole-pipeline throughput of ``recurrl train`` on CPU and on a CUDA device.

For each algorithm (PPO and recurrent DQN, the ``recurrl train`` defaults on the default
task) and each device, a trainer is built from the same options as ``recurrl train --device
D`` (envs on CPU, the model, losses and updates on D; the collector moves each step's root
there and back) and run for ``--batches`` batches after a warm-up batch. Reported per device:

* ``frames/s``: frames collected per second of the whole loop (collection + learning);
* ``collect``: frames per second of collection alone;
* ``updates/s``: learner updates (optimizer steps) per second of learning alone.

Run: ``python benchmarks/train_device.py [--devices cpu cuda] [--batches N] [--threads N]``
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from recurrl.trainers import cli
from recurrl.trainers.collection import next_batch


def _timed_batches(trainer, algo: str, batches: int) -> dict[str, float]:
    cfg = trainer.cfg
    per_batch = cfg.ppo.frames_per_batch if algo == "ppo" else cfg.dqn.frames_per_batch
    updates = (
        cfg.ppo.epochs * cfg.ppo.num_minibatches if algo == "ppo" else cfg.dqn.updates_per_batch
    )
    collect = learn = 0.0
    for i in range(batches + 1):
        sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
        start = time.perf_counter()
        batch = next_batch(trainer)
        sync()
        mid = time.perf_counter()
        if algo == "ppo":
            trainer.update(batch)
            trainer.batches += 1
        else:
            trainer.buffer.extend(batch.exclude(*_not_stored()))
            trainer.update()
        sync()
        end = time.perf_counter()
        if i:  # the first batch warms up (kernels, allocator, compiled graphs)
            collect, learn = collect + mid - start, learn + end - mid
    frames = batches * per_batch
    return {
        "frames/s": frames / (collect + learn),
        "collect": frames / collect,
        "updates/s": batches * updates / learn,
    }


def _not_stored() -> tuple:
    from recurrl.trainers.dqn import _NOT_STORED

    return _NOT_STORED


def measure(algo: str, device: str, batches: int, extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["train", "--algo", algo, "--device", device, "--run-dir", tmp, "--quiet"]
        parser = cli.build_parser()
        args = parser.parse_args([*argv, *extra])
        cfg = cli.config_from_args(args)
        trainer = cli._trainer(cfg)(cfg)
        if algo == "dqn":  # fill the buffer past learning_starts before timing updates
            while trainer.collector.frames < cfg.dqn.learning_starts:
                trainer.buffer.extend(next_batch(trainer).exclude(*_not_stored()))
        try:
            return _timed_batches(trainer, algo, batches)
        finally:
            trainer.collector.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    parser.add_argument("--algos", nargs="+", default=["ppo", "dqn"])
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("extra", nargs="*", help="more `recurrl train` options (after --)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    devices = [d for d in args.devices if not d.startswith("cuda") or torch.cuda.is_available()]
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    print(f"torch {torch.__version__}, {where}, threads={torch.get_num_threads()}")
    for algo in args.algos:
        for device in devices:
            row = measure(algo, device, args.batches, ["--num-threads", str(args.threads),
                                                       *args.extra])  # fmt: skip
            cells = ", ".join(f"{k} {v:8.1f}" for k, v in row.items())
            print(f"{algo:4} {device:5}: {cells}", flush=True)


if __name__ == "__main__":
    main()
