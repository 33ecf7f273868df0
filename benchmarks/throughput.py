"""End-to-end training throughput of ``recurrl train`` recipes, and the learner's overhead.

For each recipe (a set of ``recurrl train`` options), env engine, device and torch thread
count, one process builds the trainer exactly as ``recurrl train`` does and runs it for
``--batches`` batches after a warm-up batch. Reported per row:

* ``frames/s``: frames per second of the whole loop (collection + GAE + updates), what the
  progress line of ``recurrl train`` shows once it has warmed up;
* ``collect``: frames per second of collection alone (policy + env steps);
* ``learn``: frames per second of learning alone (GAE + every epoch's minibatch steps);
* ``step ms`` / ``bare ms`` / ``ratio``: one minibatch step (the loss on the minibatch's
  TensorDict, backward, gradient clipping, Adam) against the bare forward+backward of the
  same network on plain tensors (the same trunks through the same recurrent backend, the
  heads, the clipped-PPO and value losses written out on tensors, backward; no optimizer),
  timed in interleaved rounds. ``ratio`` is the learner's per-minibatch overhead.

Recipes (``--recipes``): ``default`` (no options: 20 envs, 1000-frame batches, 8 epochs of 5
minibatches) and the large-batch ones of :data:`RECIPES`: ``large`` (256 envs, 12,800-frame
batches, 4 epochs of 4 minibatches), ``wide`` (1024 envs, 51,200-frame batches, 2 epochs of 16
minibatches), ``fast`` (the same with 1 epoch) and ``gpu`` (8192 envs, LSTM H=128, 2 epochs of
8 minibatches: the shape of the GPU target, asked for by name). They train on CartPole-masked,
or on the env of ``--env``. Two recipes name their own env, MiniGrid-MemoryS7 (asked for by
name; the ``minigrid`` extra): ``minigrid-default`` (what ``--env`` alone trained with
before MiniGrid had a recipe of its own: the CNN encoder, 20 envs, 8 epochs of 5
minibatches) and ``minigrid-fast`` (the flat encoder, a GRU, rewards unscaled, 512 envs, 2
epochs of 8 minibatches). Engines (``--engines``): ``gymnasium`` (a
``SyncVectorEnv``, one Python call per env) and ``torch`` (recurrl's batched torch
implementation of the task, one tensor op per step for all envs); an engine the env has no
implementation for is skipped, with a line.

Run: ``python benchmarks/throughput.py [--recipes default large] [--engines gymnasium torch]
[--threads 1 2] [--devices cpu cuda] [--batches N] [--env ENV]``. MiniGrid's gymnasium path
(``minigrid-default`` on ``gymnasium``: what ``recurrl train --env
minigrid:MiniGrid-MemoryS7-v0`` ran before MiniGrid's Memory tasks had a torch env) against
the fast recipe: ``--recipes minigrid-default minigrid-fast --engines gymnasium torch``.
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
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).parent))
from _timing import compare

from recurrl.functional.recurrent import recurrent_unroll
from recurrl.modules import RecurrentModule
from recurrl.trainers import cli
from recurrl.trainers.collection import next_batch
from recurrl.trainers.errors import UsageError
from recurrl.trainers.ppo import _loss_terms, minibatches

MEMORY_S7 = "minigrid:MiniGrid-MemoryS7-v0"
#: name -> ``recurrl train`` options (PPO, CartPole-masked, LSTM H=64 unless given)
RECIPES: dict[str, list[str]] = {
    "default": [],
    "large": ["--num-envs", "256", "--epochs", "4", "--num-minibatches", "4"],
    "wide": ["--num-envs", "1024", "--epochs", "2", "--num-minibatches", "16"],
    "fast": ["--num-envs", "1024", "--epochs", "1", "--num-minibatches", "16"],
    # the GPU target's shape (LSTM H=128, thousands of envs on the device); not a CPU default
    "gpu": ["--num-envs", "8192", "--hidden-size", "128", "--epochs", "2",
            "--num-minibatches", "8"],
    # MiniGrid's 7x7x3 symbolic view: what `recurrl train --env ...` runs without options,
    # and the fast recipe of docs/guides/fast_recipes.md
    # (spelled out: `--env minigrid:...` alone now takes the MiniGrid family's recipe)
    "minigrid-default": f"--env {MEMORY_S7} --image-encoder cnn --num-envs 20 --epochs 8 "
    "--num-minibatches 5 --reward-scale 0.1".split(),
    "minigrid-fast": f"--env {MEMORY_S7} --image-encoder flat --memory gru --reward-scale 1 "
    "--num-envs 512 --epochs 2 --num-minibatches 8".split(),
}
#: recipes run only when asked for by name
BY_NAME = ("gpu", "minigrid-default", "minigrid-fast")


def build(
    recipe: list[str], engine: str, device: str, threads: int, tmp: str, env: str | None = None
) -> Any:
    """The trainer ``recurrl train`` builds for ``recipe`` (on ``env`` when given)."""
    argv = ["train", "--device", device, "--run-dir", tmp, "--quiet", "--num-threads",
            str(threads), "--engine", engine, "--no-tensorboard", "--no-plot",
            "--frames", "100000000", *recipe]  # fmt: skip  (frames: room for every timed batch)
    if env is not None:
        argv += ["--env", env]  # after the recipe's own: the last one counts
    args = cli.build_parser().parse_args(argv)
    cfg = cli.config_from_args(args)
    return cli._trainer(cfg)(cfg)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def end_to_end(trainer: Any, batches: int) -> dict[str, float]:
    """Frames/s of ``batches`` batches of the loop (after one warm-up batch)."""
    fpb = trainer.cfg.ppo.frames_per_batch
    collect = learn = 0.0
    for i in range(batches + 1):
        start = time.perf_counter()
        batch = next_batch(trainer)
        _sync(trainer.device)
        mid = time.perf_counter()
        trainer.update(batch)
        trainer.batches += 1
        _sync(trainer.device)
        end = time.perf_counter()
        if i:
            collect, learn = collect + mid - start, learn + end - mid
    frames = batches * fpb
    return {"frames/s": frames / (collect + learn), "collect": frames / collect,
            "learn": frames / learn}  # fmt: skip


def _run_plain(seq: Any, values: dict[Any, torch.Tensor]) -> None:
    """Run a ``TensorDictSequential`` on a dict of plain tensors (recurrent mode): recurrent
    trunks through :func:`recurrent_unroll` (the backend the module uses), every other
    module's wrapped ``nn.Module`` on its input tensors. Writes the outputs into ``values``."""
    for mod in seq:
        if isinstance(mod, RecurrentModule):
            x = values[mod.in_keys[0]]
            n, t = x.shape[:2]
            is_init = values["is_init"].reshape(n, t)
            states = tuple(values[k] for k in mod.in_keys[1:-1] if k != "is_init")
            y, _ = recurrent_unroll(
                mod._current_config(), mod._flat_weights(), x, states, is_init,
                options=mod._recurrent_options, training=True,
            )  # fmt: skip
            values[mod.out_keys[0]] = y
        else:
            out = mod.module(*(values[k] for k in mod.in_keys))
            out = out if isinstance(out, tuple) else (out,)
            values.update(zip(mod.out_keys, out, strict=True))


def learner_overhead(trainer: Any, rounds: int) -> dict[str, float]:
    """One minibatch step vs the bare forward+backward of the same network (discrete PPO)."""
    trainer.cfg.run.quiet = True
    batch = next_batch(trainer).to(trainer.device)
    trainer.gae(batch)
    p = trainer.cfg.ppo
    mb = next(iter(minibatches(batch, p.num_minibatches, p.slice_len)))
    model, loss = trainer.model, trainer.loss
    params = [q for q in model.parameters() if q.requires_grad]
    keys = {k for k in mb.keys(True, True)}
    plain = {k: mb.get(k) for k in keys}
    eps, coef = loss.clip_epsilon, loss.entropy_coef

    def bare() -> None:
        values = dict(plain)
        _run_plain(model.actor, values)
        _run_plain(model.critic, values)
        logp = F.log_softmax(values["logits"], -1)
        lp = logp.gather(-1, values["action"].unsqueeze(-1)).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1).mean()
        adv = values["advantage"][..., 0]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ratio = (lp - values["sample_log_prob"]).exp()
        gain = torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
        value_loss = (values["state_value"] - values["value_target"]).pow(2).mean()
        (-gain.mean() + 0.5 * value_loss - coef * ent).backward()
        for q in params:
            q.grad = None
        _sync(trainer.device)

    def step() -> None:
        total, stats = _loss_terms(loss, mb)
        trainer.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if p.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, p.max_grad_norm, foreach=True)
        trainer.optimizer.step()
        torch.stack(list(stats.values())).tolist()
        _sync(trainer.device)

    times = compare({"step": step, "bare": bare}, rounds=rounds, inner=3, warmup=2)
    return {"mb frames": mb.numel(), "step ms": times["step"] * 1e3,
            "bare ms": times["bare"] * 1e3, "ratio": times["step"] / times["bare"]}  # fmt: skip


def measure(
    recipe: list[str], engine: str, device: str, threads: int, args: argparse.Namespace
) -> dict[str, Any] | None:
    """Median figures of ``args.repeats`` fresh trainers (each warmed up by one batch), and
    every run's end-to-end frames/s under ``"runs"``; ``None`` where the recipe's env has no
    implementation on ``engine``."""
    rows = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                trainer = build(recipe, engine, device, threads, tmp, args.env)
            except UsageError as err:
                if "engine=" not in str(err):
                    raise
                return None  # e.g. --engine torch for an id without a torch env
            try:
                row = end_to_end(trainer, args.batches)
                row.update(learner_overhead(trainer, args.rounds))
            finally:
                trainer.collector.shutdown()
        rows.append(row)
    med: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["runs"] = "/".join(f"{r['frames/s']:.0f}" for r in rows)
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", choices=sorted(RECIPES),
                        default=[r for r in RECIPES if r not in BY_NAME])  # fmt: skip
    parser.add_argument("--engines", nargs="+", default=["gymnasium", "torch"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the overhead timing")
    parser.add_argument("--repeats", type=int, default=1, help="median of this many runs")
    parser.add_argument("--env", default=None,
                        help="train every recipe on this env (default: CartPole-masked, or the "
                             "recipe's own)")  # fmt: skip
    args = parser.parse_args()
    devices = [d for d in args.devices if not d.startswith("cuda") or torch.cuda.is_available()]
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    env = args.env or "CartPole-masked (or the recipe's env)"
    print(f"torch {torch.__version__}, {where}; PPO LSTM (H=64 unless given) on {env}")
    print(
        f"{'recipe':16} {'engine':9} {'device':6} {'thr':>3} {'frames/s':>9} {'collect':>9} "
        f"{'learn':>9} {'mb frames':>9} {'step ms':>8} {'bare ms':>8} {'ratio':>5}  runs"
    )
    for threads in args.threads:
        for device in devices:
            for name in args.recipes:
                for engine in args.engines:
                    if engine == "gymnasium" and device != "cpu":
                        continue  # gymnasium steps on the CPU: the cpu row is the comparison
                    med = measure(RECIPES[name], engine, device, threads, args)
                    if med is None:
                        print(f"{name:16} {engine:9} (no {engine} implementation of the env)")
                        continue
                    print(
                        f"{name:16} {engine:9} {device:6} {threads:3d} {med['frames/s']:9.0f} "
                        f"{med['collect']:9.0f} {med['learn']:9.0f} {med['mb frames']:9.0f} "
                        f"{med['step ms']:8.2f} {med['bare ms']:8.2f} {med['ratio']:5.2f}  "
                        f"{med['runs']}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
