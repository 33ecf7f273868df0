"""Replay buffer throughput: extend 1000-frame chunks, sample 2048-frame slice batches.

A 1M-frame ``LazyTensorStorage`` holding a small recurrent-RL schema (obs[4], action,
reward, done/terminated/truncated, is_init, traj_ids, rs_h[1, 16]) against the floor:

- extend: ``TensorDictReplayBuffer.extend`` vs a plain slice copy into a preallocated
  TensorDict of the same layout;
- sample: ``SliceSampler(slice_len=32)`` batches of 2048 frames vs plain indexing of the
  same stored TensorDict with precomputed valid start indices;
- both together (extend then sample, as in a train loop: the sampler's cached trajectory
  table is invalidated by every extend).

Candidates are timed in 10-call blocks (ratio of medians and of minima), then sample and
extend + sample again as single calls (ratio of the p50 and p10 call times): on a loaded
machine the blocks catch scheduler stalls that the single-call percentiles keep apart.

Candidates are measured side by side in one process, interleaved.

Run: ``python benchmarks/replay.py [--quick] [--threads N]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from tensordict import TensorDict

from recurrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

CHUNK, BATCH, SLICE_LEN = 1000, 2048, 32


def make_stream(frames: int, first_id: int, generator: torch.Generator) -> TensorDict:
    """``frames`` steps of one env with episodes of 50..500 steps and increasing ids."""
    lengths = torch.randint(50, 501, (frames // 50 + 1,), generator=generator)
    ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)[:frames] + first_id
    is_init = torch.ones(frames, dtype=torch.bool)
    is_init[1:] = ids[1:] != ids[:-1]
    done = torch.ones(frames, dtype=torch.bool)
    done[:-1] = is_init[1:]
    return TensorDict(
        {
            "observation": torch.randn(frames, 4, generator=generator),
            "action": torch.randint(2, (frames,), generator=generator),
            "is_init": is_init.unsqueeze(-1),
            "rs_h": torch.randn(frames, 1, 16, generator=generator),
            ("collector", "traj_ids"): ids,
            ("next", "observation"): torch.randn(frames, 4, generator=generator),
            ("next", "reward"): torch.randn(frames, 1, generator=generator),
            ("next", "done"): done.unsqueeze(-1),
            ("next", "terminated"): done.unsqueeze(-1),
            ("next", "truncated"): torch.zeros(frames, 1, dtype=torch.bool),
        },
        batch_size=[frames],
    )


def compare(fns: dict[str, Callable[[], object]], rounds: int, inner: int) -> dict:
    """Seconds per call of each function, in interleaved rounds (A B A B ...): the ratio of
    medians, and of minima (robust to a loaded machine), are reported."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - start) / inner)
    return {name: (statistics.median(v), min(v)) for name, v in samples.items()}


def per_call(fns: dict[str, Callable[[], object]], calls: int) -> dict:
    """Seconds of each single call, the candidates interleaved call by call: percentiles
    (p50, p10) of each. On a loaded machine a 10-call block often includes a scheduler
    stall; single calls show the stalls in the upper percentiles only."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.quantiles(v, n=20) for name, v in samples.items()}


def report_calls(what: str, q: dict, target: float | None) -> None:
    ours, plain = q["ours"], q["plain"]  # 19 cut points: [9] = p50, [1] = p10
    goal = f" (target <= {target:g}x)" if target else ""
    print(f"{what:<26} ours {ours[9] * 1e3:7.3f} ms, plain {plain[9] * 1e3:7.3f} ms p50; ratio "
          f"{ours[9] / plain[9]:4.2f}x p50, {ours[1] / plain[1]:4.2f}x p10{goal}")  # fmt: skip


def report(what: str, t: dict, target: float | None, frames: int | None = None) -> None:
    (ours, ours_min), (plain, plain_min) = t["ours"], t["plain"]
    rate = ""
    if frames:
        rate = f" = {frames / ours / 1e6:5.2f} vs {frames / plain / 1e6:5.2f} M frames/s"
    goal = f" (target <= {target:g}x)" if target else ""
    print(f"{what:<26} ours {ours * 1e3:7.3f} ms, plain {plain * 1e3:7.3f} ms{rate}; ratio "
          f"{ours / plain:4.2f}x median, {ours_min / plain_min:4.2f}x min{goal}")  # fmt: skip


def valid_starts(stored: TensorDict, cursor: int) -> torch.Tensor:
    """Positions whose next SLICE_LEN steps (in time order, from the full ring) share one
    trajectory id: the precomputed index table of the plain-indexing floor."""
    cap = stored.batch_size[0]
    order = (torch.arange(cap) + cursor) % cap  # oldest first
    ids = stored["collector", "traj_ids"][order]
    same = torch.ones(cap, dtype=torch.bool)
    same[1:] = ids[1:] == ids[:-1]
    same[0] = False
    # run length of "linked to the previous step", as a cumulative count reset at breaks
    breaks = torch.where(~same, torch.arange(cap), 0).cummax(0).values
    pos_in_run = torch.arange(cap) - breaks
    ends = pos_in_run[SLICE_LEN - 1 :] >= SLICE_LEN - 1  # slice [i, i + L) stays in the run
    return order[: cap - SLICE_LEN + 1][ends]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k-frame buffer, fewer rounds")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    capacity = 100_000 if args.quick else 1_000_000
    rounds, inner = (7, 5) if args.quick else (30, 10)
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, buffer={capacity} "
          f"frames, chunk={CHUNK}, batch={BATCH} (slice_len={SLICE_LEN})")  # fmt: skip
    g = torch.Generator().manual_seed(0)
    fill = make_stream(capacity + CHUNK // 2, 0, g)  # wraps once: the cursor is mid-buffer
    extra = make_stream(200 * CHUNK, int(fill["collector", "traj_ids"][-1]) + 1, g)
    chunks = [extra[i * CHUNK : (i + 1) * CHUNK] for i in range(200)]

    sampler = SliceSampler(slice_len=SLICE_LEN)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler,
                                batch_size=BATCH)  # fmt: skip
    for i in range(0, fill.batch_size[0], CHUNK):
        rb.extend(fill[i : i + CHUNK])
    plain = rb.storage.data.clone()  # the floor's preallocated TensorDict, same layout

    state = {"ours": 0, "plain": 0, "plain_cursor": rb.storage.cursor}

    def ours_extend():
        rb.extend(chunks[state["ours"] % len(chunks)])
        state["ours"] += 1

    def plain_extend():
        chunk = chunks[state["plain"] % len(chunks)]
        state["plain"] += 1
        c = state["plain_cursor"]
        first = min(CHUNK, capacity - c)
        plain[c : c + first] = chunk[:first]
        if first < CHUNK:
            plain[: CHUNK - first] = chunk[first:]
        state["plain_cursor"] = (c + CHUNK) % capacity

    t_ext = compare({"ours": ours_extend, "plain": plain_extend}, rounds=rounds, inner=inner)

    # The same frames as [8 envs, 125 steps] batches (written row by row; ids stay unique).
    grids = [c.clone().view(8, CHUNK // 8) for c in chunks[:50]]
    flat_grids = [g.reshape(-1) for g in grids]

    def ours_extend_grid():
        rb.extend(grids[state["ours"] % len(grids)])
        state["ours"] += 1

    def plain_extend_grid():
        chunk = flat_grids[state["plain"] % len(grids)]
        state["plain"] += 1
        c = state["plain_cursor"]
        first = min(CHUNK, capacity - c)
        plain[c : c + first] = chunk[:first]
        if first < CHUNK:
            plain[: CHUNK - first] = chunk[first:]
        state["plain_cursor"] = (c + CHUNK) % capacity

    t_grid = compare({"ours": ours_extend_grid, "plain": plain_extend_grid}, rounds=rounds,
                     inner=inner)  # fmt: skip

    stored = rb.storage.data
    starts = valid_starts(stored, rb.storage.cursor)
    steps = torch.arange(SLICE_LEN)
    num_slices = BATCH // SLICE_LEN

    def plain_sample():
        pick = starts[torch.randint(starts.numel(), (num_slices,))]
        return stored[((pick.unsqueeze(-1) + steps) % capacity).reshape(-1)]

    t_smp = compare({"ours": rb.sample, "plain": plain_sample}, rounds=rounds, inner=inner)

    def ours_both():
        ours_extend()
        rb.sample()

    def plain_both():
        plain_extend()
        plain_sample()  # the floor does not even update its start table

    t_both = compare({"ours": ours_both, "plain": plain_both}, rounds=rounds, inner=inner)
    calls = 300 if args.quick else 1500
    q_smp = per_call({"ours": rb.sample, "plain": plain_sample}, calls)
    q_both = per_call({"ours": ours_both, "plain": plain_both}, calls)

    segments = rb.sampler._segments.lengths.size
    print(f"stored trajectory segments: {segments}; median / min over {rounds} rounds")
    report(f"extend {CHUNK} frames", t_ext, 2.0, CHUNK)
    report(f"extend [8, {CHUNK // 8}] frames", t_grid, 2.0, CHUNK)
    report(f"sample {BATCH} frames", t_smp, 1.2)
    report("extend + sample", t_both, None)
    print(f"single calls, interleaved ({calls} each):")
    report_calls(f"sample {BATCH} frames", q_smp, 1.2)
    report_calls("extend + sample", q_both, None)


if __name__ == "__main__":
    main()
