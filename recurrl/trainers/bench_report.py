"""The files ``recurrl bench`` writes from its summary: ``summary.json``, ``summary.md`` and
``report.md`` (Markdown tables and plot links, to paste into a paper or a README).

The summary is the dictionary :func:`recurrl.trainers.bench.run_bench` builds (one entry per
task x model in ``cells``, one per model in ``aggregate``); this module only formats it.

Examples:
    >>> interval({"iqm": 0.5, "ci_low": 0.25, "ci_high": 0.75}, "iqm")
    '0.50 [0.25, 0.75]'
    >>> interval(None, "iqm")
    '-'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["DEFINITIONS", "interval", "write_report"]

DEFINITIONS = """\
- **MMER** (max-mean episodic return, the POPGym paper's metric): per run, the running maximum
  over training of the mean return of the episodes that ended in each batch (sampled actions),
  its last value; the cell is its mean over seeds. A best-so-far training statistic: at least
  what the same policy scores at the end. The returns are the env's own (unscaled); popgym's
  tasks scale their rewards so that an episode's return lies in [-1, 1] (the paper's scale).
- **Greedy return**: per run, the mean return of the final policy's greedy (most likely
  action) episodes on unseen seeds; the cell is its interquartile mean (IQM, the mean of the
  middle 50% of the seeds) with a 95% percentile bootstrap interval over the seeds, and the
  share of seeds whose greedy return reaches the success threshold.
- **Normalized score**: a return mapped to [0, 1] by its family's return range, `(R - low) /
  (high - low)`: `(R + 1) / 2` on popgym ([-1, 1]), `R` on MiniGrid, `R / 500` on
  CartPole-masked. A task without a known range has none and stays out of the aggregate.
- **Aggregate** (per model): the mean normalized score over tasks (each task the mean over its
  seeds), with a 95% stratified percentile bootstrap interval (the seeds resampled within each
  task, as rliable's `get_interval_estimates` with `aggregate_mean`).
- **Success**: a greedy return whose normalized score is at least {success:g}."""


def interval(stats: dict[str, Any] | None, key: str, digits: int = 2) -> str:
    """``value [low, high]`` of ``stats[key]`` and its interval, or ``-``."""
    if not stats:
        return "-"
    f = f".{digits}f"
    return f"{stats[key]:{f}} [{stats['ci_low']:{f}}, {stats['ci_high']:{f}}]"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _rate(stats: dict[str, Any] | None) -> str:
    rate = None if not stats else stats.get("success_rate")
    return "-" if rate is None else f"{rate:.0%}"


def _cells(s: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["task"], c["memory"]): c for c in s["cells"]}


def _aggregate_table(s: dict[str, Any]) -> list[str]:
    lines = [
        "| model | MMER score [95% CI] | greedy score [95% CI] | tasks | runs |",
        "|---|---|---|---|---|",
    ]
    for memory, a in s["aggregate"].items():
        m, g = a["score"], a["greedy_score"]
        lines.append(f"| {memory} | {interval(m, 'mean')} | {interval(g, 'mean')} | "
                     f"{m['tasks'] if m else 0} | {m['runs'] if m else 0} |")  # fmt: skip
    return lines


def _task_tables(s: dict[str, Any]) -> list[str]:
    cells, memories = _cells(s), s["memories"]
    head = "| task | frames | " + " | ".join(memories) + " |"
    sep = "|---|---|" + "---|" * len(memories)
    mmer, greedy = [head, sep], [head, sep]
    for task in s["tasks"]:
        row = [cells[(task, m)] for m in memories]
        frames = next((c["frames"] for c in row if c["frames"]), None)
        shown = "-" if frames is None else f"{frames / 1000:g}k"
        mmer.append(f"| {task} | {shown} | " + " | ".join(
            _cell_text(c, _num(c["mmer"])) for c in row) + " |")  # fmt: skip
        greedy.append(f"| {task} | {shown} | " + " | ".join(
            _cell_text(c, f"{interval(c['greedy'], 'iqm')}, {_rate(c['greedy'])}")
            for c in row) + " |")  # fmt: skip
    return [
        "## MMER per task", "",
        "Mean over seeds of each run's MMER, on the env's return scale (popgym: [-1, 1]).", "",
        *mmer, "",
        "## Final greedy return per task", "",
        "IQM [95% bootstrap CI] over seeds, and the success rate.", "",
        *greedy,
    ]  # fmt: skip


def _cell_text(cell: dict[str, Any], text: str) -> str:
    n = len(cell["runs"])
    if cell["mmer_runs"] == 0:
        return "error" if cell["errors"] else "no finished run"
    return text if cell["mmer_runs"] == n else f"{text} ({cell['mmer_runs']}/{n} seeds)"


def _report(s: dict[str, Any]) -> str:
    lines = [
        f"# recurrl bench: {s['suite']}", "",
        f"`{s['command']}`", "",
        f"PPO; seeds {s['seeds']}; each run's final policy evaluated greedily over "
        f"{s['eval_episodes']} episodes. Tasks and budget: {s['source'] or 'given by --tasks'}.",
        "",
        "## Aggregate per model", "",
        "Mean normalized score over tasks x seeds, 95% stratified bootstrap CI.", "",
        *_aggregate_table(s), "",
        *_task_tables(s), "",
    ]  # fmt: skip
    if s["plots"]:
        lines += ["## Learning curves", "",
                  "Training return (last 20 episodes) over frames: mean over seeds, min/max band.",
                  ""]  # fmt: skip
        lines += [f"![{task}]({path})" for task, path in s["plots"].items()] + [""]
    lines += ["## Recipes", "", "| family | `recurrl train` options | return range | source |",
              "|---|---|---|---|"]  # fmt: skip
    for name, r in s["recipes"].items():
        options = " ".join(r["options"]) or "(the defaults)"
        lines.append(f"| {name} | `{options}` | {r['returns']} | {r['source']} |")
    if s.get("memory_recipes"):  # summaries written before memory recipes have none
        lines += ["", "Memory models with a recipe of their own (over the family's, under the "
                  "options after `--`):", "", "| memory | `recurrl train` options | source |",
                  "|---|---|---|"]  # fmt: skip
        for name, r in s["memory_recipes"].items():
            lines.append(f"| {name} | `{' '.join(r['options'])}` | {r['source']} |")
    lines += ["", "## Definitions", "", DEFINITIONS.format(success=s["success"]), ""]
    lines += [*s["notes"], ""] if s["notes"] else []
    return "\n".join(lines)


def _summary_md(s: dict[str, Any]) -> str:
    lines = [
        f"# recurrl bench: {s['suite']} (summary)", "", f"`{s['command']}`", "",
        "| task | model | seeds done | MMER | MMER score | greedy IQM [95% CI] | success | "
        "directory |", "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for c in s["cells"]:
        lines.append(
            f"| {c['task']} | {c['memory']} | {c['mmer_runs']}/{len(c['runs'])} | "
            f"{_num(c['mmer'], 3)} | {_num(c['score'], 3)} | {interval(c['greedy'], 'iqm', 3)} "
            f"| {_rate(c['greedy'])} | {c['dir']} |"
        )
    lines += ["", *_aggregate_table(s), ""]
    errors = [f"- {c['task']} {c['memory']}: {e.splitlines()[0] if e else e}" for c in s["cells"]
              for e in c["errors"]]  # fmt: skip
    if errors:
        lines += ["Failed runs (their logs: DIR/logs/):", "", *errors, ""]
    return "\n".join(lines)


def write_report(summary: dict[str, Any], out: Path) -> None:
    """Write ``OUT/summary.json``, ``OUT/summary.md`` and ``OUT/report.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(_summary_md(summary))
    (out / "report.md").write_text(_report(summary))
