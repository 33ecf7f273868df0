"""``recurrl train`` with Ray workers stepping batched torch envs, against the local collector.

Is the learner still the cap when the envs step in Ray workers? For each size, one process
builds the trainer exactly as ``recurrl train`` does (PPO, the fast recipe ``--epochs 1
--num-minibatches 16``, CartPole-masked, ``--engine auto``: recurrl's batched torch
CartPole, LSTM H=64, 50 steps per env per batch) and runs ``--batches`` batches after a
warm-up batch:

* ``local N``: the :class:`~recurrl.collectors.Collector` in this process, ``--num-envs N``;
* ``ray W x K``: ``--collector ray --workers W --envs-per-worker K`` (``N = W * K``, the
  same batch and updates);
* with ``--transport both``, also ``ray W x K pickled``: the same, with the batches pickled as
  TensorDicts (torch's own pickling) instead of the numpy wire form; how batches travelled
  before ``recurrl.collectors._ray_wire`` existed.

Reported per row (the median of ``--repeats`` rounds; a round runs every row once, in turn,
so the machine's load spreads evenly over them). Wall-clock rates:

* ``frames/s``: frames per second of the loop (collection + GAE + updates);
* ``collect``: frames per second of collection as the learner sees it (the wait for the next
  batch: with Ray, the workers' steps, the batch's way through Ray's object store and the
  copy into this process);
* ``learn``: frames per second of learning alone (GAE + the minibatch steps), in this process;
* ``rollout``: (Ray) frames per second of the workers' own ``Collector.rollout`` (the slowest
  worker of each batch), without the way to the learner;
* ``moved ms``: (Ray) milliseconds per batch between the end of the slowest worker's rollout
  and the batch in the learner's hands (serialization, object store, copy, scheduling).

CPU-time figures, which other processes on a shared machine change much less (they take
cores away, not CPU seconds per frame):

* ``learn cpu``: frames per CPU second of this process while it learns (all its threads);
* ``roll cpu``: frames per CPU second of the rollouts (local: this process while it
  collects; Ray: the workers' rollout threads, summed);
* ``move cpu ms``: (Ray) CPU milliseconds per batch of moving it: this process while it
  waits for and copies the batch, plus the workers' processes outside their rollouts
  (serialization into the object store, Ray's own work).

PPO is on-policy (the weights are sent after every update, and a batch is collected with
them), so collection and learning alternate: ``1 / frames/s = 1 / collect + 1 / learn``,
and the smaller of the two rates is the cap. The learner runs ``--threads`` torch threads,
each Ray worker one (Ray's default for an actor of one CPU).

First, the cost of moving one batch alone (``transport``): ``W`` batches of ``K`` envs put
into and read back from Ray's object store and concatenated, as pickled TensorDicts and in
the wire form, side by side in this process.

Ray is started here, locally (``address="local"``, one logical CPU per worker), once for
every row, and stopped at the end; nothing connects to another address.

Run: ``python benchmarks/ray_throughput.py [--envs-per-worker 256 1024] [--workers 1 2]
[--threads 2] [--batches 3] [--repeats 3] [--transport wire|both]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare
from throughput import build

import recurrl.collectors.ray as ray_collector
from recurrl.collectors._ray_wire import pack, unpack
from recurrl.collectors._ray_worker import CollectorWorker
from recurrl.trainers.collection import next_batch

FAST = ["--epochs", "1", "--num-minibatches", "16"]


class PickledTransport(CollectorWorker):
    """A remote collector whose batches travel as pickled TensorDicts (``--transport
    both``): its process skips the wire form, as before it existed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import recurrl.collectors._ray_worker as worker_module

        worker_module.pack = lambda td: td  # in this actor's process only
        super().__init__(*args, **kwargs)


def remote_timings(collector: Any) -> dict[str, float]:
    """The Ray workers' time so far: ``wall`` (the slowest worker's seconds in
    ``Collector.rollout``), ``cpu`` (all workers' CPU seconds in it) and ``other`` (their
    processes' other CPU seconds: serialization into the object store, Ray's own work)."""
    import ray

    timings = ray.get([w.handle.timings.remote() for w in collector._workers])
    cpu = sum(t["rollout_cpu_seconds"] for t in timings)
    return {
        "wall": max(t["rollout_seconds"] for t in timings),
        "cpu": cpu,
        "other": sum(t["process_cpu_seconds"] for t in timings) - cpu,
    }


def run(recipe: list[str], threads: int, batches: int, remote: bool) -> dict[str, float]:
    """Wall-clock and CPU-time rates of ``batches`` batches after a warm-up one."""
    names = ("collect", "learn", "collect_cpu", "learn_cpu", "wall", "cpu", "other")
    total = dict.fromkeys(names, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build([*FAST, *recipe], "auto", "cpu", threads, tmp)
        try:
            fpb = trainer.cfg.ppo.frames_per_batch
            for i in range(batches + 1):
                before = remote_timings(trainer.collector) if remote else {}
                start, start_cpu = time.perf_counter(), time.process_time()
                batch = next_batch(trainer)
                mid, mid_cpu = time.perf_counter(), time.process_time()
                trainer.update(batch)
                trainer.batches += 1
                end, end_cpu = time.perf_counter(), time.process_time()
                if not i:
                    continue  # the warm-up batch
                after = remote_timings(trainer.collector) if remote else {}
                spent = {"collect": mid - start, "learn": end - mid,
                         "collect_cpu": mid_cpu - start_cpu, "learn_cpu": end_cpu - mid_cpu,
                         **{k: after[k] - before[k] for k in after}}  # fmt: skip
                for key, value in spent.items():
                    total[key] += value
        finally:
            trainer.collector.shutdown()
    frames = batches * fpb
    row = {
        "frames/s": frames / (total["collect"] + total["learn"]),
        "collect": frames / total["collect"],
        "learn": frames / total["learn"],
        "learn cpu": frames / total["learn_cpu"],
    }
    if remote:
        row["rollout"] = frames / total["wall"]
        row["moved ms"] = 1e3 * (total["collect"] - total["wall"]) / batches
        row["roll cpu"] = frames / total["cpu"]
        row["move cpu ms"] = 1e3 * (total["collect_cpu"] + total["other"]) / batches
    else:
        row["roll cpu"] = frames / total["collect_cpu"]
    return row


def transport(per: int, workers: int, threads: int) -> dict[str, float]:
    """Milliseconds to move ``workers`` batches of ``per`` envs through Ray's object store
    into one ``[workers * per, T]`` batch here: pickled TensorDicts (put, get,
    ``torch.cat``) against the wire form (pack, put, get, :func:`unpack`). One process:
    the serialization and copies, not the scheduling."""
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build([*FAST, "--num-envs", str(per)], "auto", "cpu", threads, tmp)
        try:
            batch = next_batch(trainer)
        finally:
            trainer.collector.shutdown()

    def pickled() -> None:
        parts = [ray.get(ray.put(batch)) for _ in range(workers)]
        torch.cat(parts, 0) if workers > 1 else parts[0]

    def wire() -> None:
        unpack([ray.get(ray.put(pack(batch))) for _ in range(workers)])

    times = compare({"pickled": pickled, "wire": wire}, rounds=5, inner=1, warmup=1)
    size = sum(v.numel() * v.element_size() for v in batch.values(True, True))
    return {"MB": workers * size / 1e6, **{k: 1e3 * v for k, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs-per-worker", nargs="+", type=int, default=[256, 1024])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the learner")
    parser.add_argument("--batches", type=int, default=3, help="timed batches per run")
    parser.add_argument("--repeats", type=int, default=3, help="median of this many rounds")
    parser.add_argument("--transport", choices=["wire", "both"], default="wire")
    args = parser.parse_args()

    import ray

    ray.init(address="local", num_cpus=max(args.workers), include_dashboard=False,
             logging_level="ERROR", log_to_driver=False)  # fmt: skip
    wire_class = ray_collector._remote_worker_class()
    pickled_class = ray.remote(PickledTransport)
    rows: dict[str, tuple[list[str], bool, Any]] = {}
    for per in args.envs_per_worker:
        for workers in args.workers:
            n = workers * per
            rows[f"local {n}"] = (["--num-envs", str(n)], False, None)
            ray_args = ["--collector", "ray", "--workers", str(workers), "--envs-per-worker",
                        str(per)]  # fmt: skip
            rows[f"ray {workers} x {per}"] = (ray_args, True, wire_class)
            if args.transport == "both":
                rows[f"ray {workers} x {per} pickled"] = (ray_args, True, pickled_class)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    moves = {}
    try:
        for per in args.envs_per_worker:
            for workers in args.workers:
                moves[f"{workers} x {per}"] = transport(per, workers, args.threads)
        for round_ in range(args.repeats):
            for name, (recipe, remote, cls) in rows.items():
                ray_collector._REMOTE_CLASS = cls or wire_class
                row = run(recipe, args.threads, args.batches, remote)
                results[name].append(row)
                cells = " ".join(f"{k} {v:.0f}" for k, v in row.items())
                print(f"round {round_ + 1}: {name}: {cells}", file=sys.stderr, flush=True)
    finally:
        ray_collector._REMOTE_CLASS = wire_class
        ray.shutdown()

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads here; PPO fast recipe "
        f"({' '.join(FAST)}), CartPole-masked, engine torch, LSTM H=64; learner "
        f"{args.threads} threads; median of {args.repeats}, {args.batches} batches each"
    )
    print("\nOne batch through the object store (ms, median of 5; one process):")
    print(f"{'workers x envs':16} {'MB':>6} {'pickled':>8} {'wire':>8}")
    for name, m in moves.items():
        print(f"{name:16} {m['MB']:6.0f} {m['pickled']:8.0f} {m['wire']:8.0f}")
    print()
    keys = ["frames/s", "collect", "learn", "rollout", "moved ms", "learn cpu", "roll cpu",
            "move cpu ms"]  # fmt: skip
    print(f"{'collector':24} " + " ".join(f"{k:>11}" for k in keys) + "  runs (frames/s)")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in keys if k in runs[0]}
        cells = " ".join(f"{med[k]:11.0f}" if k in med else f"{'-':>11}" for k in keys)
        every = "/".join(f"{r['frames/s']:.0f}" for r in runs)
        print(f"{name:24} {cells}  {every}", flush=True)


if __name__ == "__main__":
    main()
