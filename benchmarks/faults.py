"""`recurrl train --collector ray` with its Ray processes killed (SIGKILL) during the run.

The fault targets of the cluster guide (docs/guides/cluster.md):

* ``--fault workers``: a Ray worker killed every ~P seconds for the whole run (PPO on
  CartPole-masked with 4 workers, P = 10 s);
* ``--fault replay``: DQN's replay buffer actor killed once, when the run reaches
  ``--kill-at`` frames;
* ``--fault learner``: ``recurrl train --resume-on-failure`` (local collection) whose
  training process is killed ``--kills`` times (default 2), each ~P seconds after it
  started; the run must end complete, with a ``metrics.csv`` without gap or duplicate frames.

The run must complete without a person, learn as an undisturbed run does (greedy evaluation
on unseen episodes) and leave no process behind. Each seed is one run in a child process
(its own local Ray cluster, shut down by the run): a thread of the child picks a live
worker (``RayCollector.worker_info``) at random every ``--period`` seconds (uniform in
[0.5P, 1.5P]), or the replay actor's process, and SIGKILLs it. Afterwards the parent
evaluates the run greedily (``recurrl.trainers.evaluate``, 20 unseen episodes) and looks for
processes the run left behind (for up to 60 s: Ray's processes exit shortly after its
shutdown returns): any process whose parent chain leads to the child, and any ``ray::`` /
``raylet`` / ``gcs_server`` process that did not exist before the run.

    python benchmarks/faults.py --fault workers --seeds 0-4 -- --workers 4 \
        --max-restarts 1000 --max-restarts-per-minute 20
    python benchmarks/faults.py --fault replay --algo dqn --seeds 0-4 -- --workers 2
    python benchmarks/faults.py --fault learner --period 12 --seeds 0-4

(A kill every ~10 s exceeds `recurrl train`'s default budget of 3 replacements per run and
its rate limit of 5 a minute: the first command raises both, as a user expecting that many
failures would.)
Options after ``--`` go to ``recurrl train`` (``--collector ray --quiet --no-plot
--no-tensorboard --eval-episodes 0`` are added). Prints one line per run and a table.
Build the C++ kernels first (``recurrl build-ext``) unless the point is to kill workers
while they compile.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RAY_PROCESSES = ("ray::", "raylet", "gcs_server", "plasma_store", "dashboard")


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process (Linux ``/proc``)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited meanwhile
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])  # "pid (comm) state ppid ..."
        name = stat[stat.index("(") : stat.rindex(")") + 1]
        found[int(entry.name)] = (parent, cmdline.strip() or name)
    return found


def _ray_pids() -> set[int]:
    """Processes of a Ray cluster on this machine (by command line)."""
    return {pid for pid, (_, text) in _processes().items() if any(n in text for n in RAY_PROCESSES)}


def _descendants(root: int) -> list[int]:
    """Live processes whose parent chain leads to ``root``."""
    table = _processes()
    found = []
    for pid in table:
        seen, current = set(), pid
        while current in table and current not in seen and current != root:
            seen.add(current)
            current = table[current][0]
        if current == root and pid != root:
            found.append(pid)
    return sorted(found)


def _child(fault: str, period: float, kill_at: int, seed: int, out: Path, argv: list[str]) -> int:
    """In the run's process: the killer thread, then ``recurrl train``."""
    from recurrl.trainers import loop
    from recurrl.trainers.cli import main

    holder: dict = {}
    kills: list[tuple[float, int]] = []
    original = loop.next_batch

    def next_batch(trainer):  # keep the trainer for the thread below
        holder.setdefault("trainer", trainer)
        return original(trainer)

    def kill(pid: int, what: str) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        kills.append((time.monotonic() - start, pid))
        print(f"faults: SIGKILL to {what} pid {pid} (kill {len(kills)})", file=sys.stderr,
              flush=True)  # fmt: skip
        return True

    def kill_workers() -> None:
        rng = random.Random(seed)
        collector = holder["trainer"].collector
        while True:
            time.sleep(rng.uniform(0.5 * period, 1.5 * period))
            live = [w["pid"] for w in collector.worker_info if w.get("pid") and _alive(w["pid"])]
            if live:
                kill(rng.choice(live), "Ray worker")

    def kill_replay() -> None:
        import ray

        trainer = holder["trainer"]
        while trainer.collector.frames < kill_at:
            time.sleep(0.2)
        kill(ray.get(trainer.buffer._actor.pid.remote()), "the replay buffer's actor")

    def killer() -> None:
        while "trainer" not in holder:
            time.sleep(0.2)
        (kill_workers if fault == "workers" else kill_replay)()

    start = time.monotonic()
    loop.next_batch = next_batch
    threading.Thread(target=killer, daemon=True).start()
    code = main(["train", *argv])
    out.write_text(json.dumps({"code": code, "kills": kills}))
    return code


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_learner(
    supervisor: subprocess.Popen, period: float, kills: int, done: list[tuple[float, int]]
) -> None:
    """SIGKILL the training process that ``supervisor`` (``recurrl train
    --resume-on-failure``) runs, ``period`` seconds after each one started, ``kills`` times."""
    start, seen = time.monotonic(), set()
    while len(done) < kills and supervisor.poll() is None:
        children = [pid for pid, (parent, _) in _processes().items() if parent == supervisor.pid]
        fresh = [pid for pid in children if pid not in seen]
        if not fresh:
            time.sleep(0.2)
            continue
        pid = fresh[0]
        seen.add(pid)
        time.sleep(period)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue  # it finished first
        done.append((time.monotonic() - start, pid))
        print(f"faults: SIGKILL to the training process pid {pid} (kill {len(done)})",
              file=sys.stderr, flush=True)  # fmt: skip


def _seeds(text: list[str]) -> list[int]:
    seeds: list[int] = []
    for part in text:
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    train_argv: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, train_argv = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", choices=["workers", "replay", "learner"], default="workers")
    parser.add_argument("--kills", type=int, default=2, help="learner: times it is killed")
    parser.add_argument("--seeds", nargs="+", default=["0-4"])
    parser.add_argument("--period", type=float, default=10.0, help="mean seconds between kills")
    parser.add_argument("--kill-at", type=int, default=50_000, help="replay: frame of the kill")
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--eval-episodes", type=int, default=20)
    parser.add_argument("--threshold", type=float, default=450.0)
    parser.add_argument("--out", type=Path, default=None, help="where the runs go")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        seed, out = int(args.child[0]), Path(args.child[1])
        return _child(args.fault, args.period, args.kill_at, seed, out, train_argv)

    out = args.out or Path(tempfile.mkdtemp(prefix="faults."))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in _seeds(args.seeds):
        run_dir = out / f"s{seed}"
        result = out / f"s{seed}.json"
        before = _ray_pids()
        cmd = [
            *(sys.executable, __file__, "--fault", args.fault, "--period", str(args.period)),
            *("--kill-at", str(args.kill_at), "--child", str(seed), str(result), "--"),
            *("--algo", args.algo, "--collector", "ray", "--seed", str(seed)),
            *("--run-dir", str(run_dir), "--quiet", "--no-plot", "--no-tensorboard"),
            *("--eval-episodes", "0", *train_argv),
        ]
        if args.fault == "learner":  # the supervisor itself runs in the child process
            cmd = [
                *(sys.executable, "-m", "recurrl", "train", "--algo", args.algo),
                *("--seed", str(seed), "--run-dir", str(run_dir), "--quiet", "--no-plot"),
                *("--no-tensorboard", "--eval-episodes", "0"),
                *("--resume-on-failure", str(args.kills + 1), *train_argv),
            ]
        start = time.monotonic()
        proc = subprocess.Popen(cmd)
        if args.fault == "learner":
            learner_kills: list[tuple[float, int]] = []
            threading.Thread(
                target=_kill_learner, args=(proc, args.period, args.kills, learner_kills),
                daemon=True,
            ).start()  # fmt: skip
        code = proc.wait()
        wall = time.monotonic() - start
        if args.fault == "learner":
            result.write_text(json.dumps({"code": code, "kills": learner_kills}))
        deadline = time.monotonic() + 60.0  # Ray's processes exit after its shutdown returns
        while True:
            left = sorted((_ray_pids() - before) | set(_descendants(proc.pid)))
            if not left or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        kills = json.loads(result.read_text())["kills"] if result.exists() else []
        greedy = float("nan")
        restarts = ""
        if code == 0:
            from recurrl.trainers.evaluate import evaluate

            greedy = statistics.fmean(evaluate(run_dir, episodes=args.eval_episodes))
            with open(run_dir / "metrics.csv") as f:
                last = f.read().strip().splitlines()
            header, final = last[0].split(","), last[-1].split(",")
            if args.fault == "learner":
                frames = [int(row.split(",")[header.index("frames")]) for row in last[1:]]
                step = frames[0]
                restarts = "no gap or duplicate" if frames == [step * (i + 1) for i in range(
                    len(frames))] else f"GAP OR DUPLICATE: {frames}"  # fmt: skip
            else:
                column = "worker_restarts" if args.fault == "workers" else "replay_restarts"
                restarts = final[header.index(column)]
        rows.append((seed, code, len(kills), restarts, greedy, wall, left))
        print(f"seed {seed}: exit {code}, {len(kills)} kills, restarts {restarts}, "
              f"greedy {greedy:.1f}, {wall:.0f} s, processes left: {left or 'none'}",
              flush=True)  # fmt: skip
    column = {"workers": "worker_restarts", "replay": "replay_restarts"}.get(
        args.fault, "metrics.csv frames"
    )
    print(f"\n| seed | exit | kills | {column} | greedy (mean of "
          f"{args.eval_episodes}) | wall | processes left |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for seed, code, kills, restarts, greedy, wall, left in rows:
        print(f"| {seed} | {code} | {kills} | {restarts} | {greedy:.1f} | {wall:.0f} s | "
              f"{len(left)} |")  # fmt: skip
    ok = sum(1 for r in rows if r[1] == 0 and r[4] >= args.threshold)
    print(f"\ncompleted {sum(1 for r in rows if r[1] == 0)}/{len(rows)}; greedy >= "
          f"{args.threshold:g} on {ok}/{len(rows)}; runs in {out}")  # fmt: skip
    return 0 if all(r[1] == 0 and not r[6] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
