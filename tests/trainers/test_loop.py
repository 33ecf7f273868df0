"""The shared training loop (``recurrl/trainers/loop.py``) driven by a fake recipe: hooks in
order, checkpoint cadence, ``stop_after``, the stop request, the learning curve only on a
completed run, the progress line and its frames per second (from a fake clock: no timing)."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from recurrl.trainers import loop
from recurrl.trainers.config import EnvConfig, PPOConfig, RunConfig, TrainConfig
from recurrl.trainers.logger import read_metrics
from recurrl.trainers.loop import Trainer

from ._helpers import StopAfterBatches

FRAMES, PER_BATCH, ENVS = 1000, 100, 2


class FakeCollector:
    """Yields ``[ENVS, PER_BATCH / ENVS]`` batches where every env row ends an episode whose
    return is the frames collected so far (so every batch's returns differ)."""

    def __init__(self) -> None:
        self.frames = 0
        self.shut_down = False

    def __iter__(self):
        steps = PER_BATCH // ENVS
        while True:
            self.frames += PER_BATCH
            done = torch.zeros(ENVS, steps, 1, dtype=torch.bool)
            done[:, -1] = True
            reward = torch.full((ENVS, steps, 1), float(self.frames))
            yield TensorDict(
                {"next": {"done": done, "episode_reward": reward}}, batch_size=[ENVS, steps]
            )

    def shutdown(self) -> None:
        self.shut_down = True


class FakeRecipe(Trainer):
    """A recipe that records the loop's calls instead of learning."""

    algo = "ppo"

    def build(self) -> None:
        self.model = nn.Linear(1, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.collector = FakeCollector()
        self.calls: list[tuple[str, int]] = []

    def start(self) -> None:
        self.calls.append(("start", self.collector.frames))

    def before_batch(self) -> dict[str, float]:
        self.calls.append(("before_batch", self.collector.frames))
        return {"lr": 1.0 - self.collector.frames / FRAMES}

    def learn(self, batch, logged):
        self.calls.append(("learn", self.collector.frames))
        returns = self.track_episodes(batch)
        self.batches += 1
        return {**self.episode_row(returns), **logged, "loss": 0.5}

    def progress(self, row) -> str:
        return f"loss {row['loss']:.2f}"

    def checkpoint(self) -> None:
        self.calls.append(("checkpoint", self.collector.frames))

    def close(self) -> None:
        super().close()
        self.calls.append(("close", self.collector.frames))


@pytest.fixture
def plots(monkeypatch) -> list[tuple[object, str]]:
    """The learning curves the loop asks for (none is drawn)."""
    drawn: list[tuple[object, str]] = []
    monkeypatch.setattr(loop, "plot_learning_curve", lambda d, title: drawn.append((d, title)))
    return drawn


def _recipe(tmp_path, *, quiet: bool = True, plot: bool = True) -> FakeRecipe:
    cfg = TrainConfig(
        env=EnvConfig(env="CartPole-v1", num_envs=ENVS),
        ppo=PPOConfig(frames=FRAMES, frames_per_batch=PER_BATCH),
        run=RunConfig(run_dir=str(tmp_path), checkpoint_every=250, quiet=quiet,
                      tensorboard=False, plot=plot),
    )  # fmt: skip
    return FakeRecipe(cfg)


def _checkpoints(recipe: FakeRecipe) -> list[int]:
    return [frames for call, frames in recipe.calls if call == "checkpoint"]


def test_a_complete_run_calls_the_hooks_in_order_and_checkpoints_on_the_cadence(tmp_path, plots):
    recipe = _recipe(tmp_path)
    assert recipe.train() == tmp_path
    calls = recipe.calls
    assert calls[0] == ("start", 0) and calls[-1] == ("close", FRAMES)
    # each batch: the hook before it sees the frames done, then the batch is learned from
    batches = [c for c in calls if c[0] in ("before_batch", "learn")]
    assert batches == [
        (call, f) for f in range(0, FRAMES, PER_BATCH)
        for call, f in (("before_batch", f), ("learn", f + PER_BATCH))
    ]  # fmt: skip
    # every time the frames cross a multiple of 250, and at the end
    assert _checkpoints(recipe) == [300, 500, 800, 1000]
    assert recipe.collector.shut_down
    assert plots == [(tmp_path, "PPO lstm on CartPole-v1")]
    rows = read_metrics(tmp_path)
    assert [int(r["frames"]) for r in rows] == list(range(PER_BATCH, FRAMES + 1, PER_BATCH))
    assert [int(r["batch"]) for r in rows] == list(range(1, 11))
    assert list(rows[0]) == [
        "frames", "batch", "episodes", "episode_return", "recent_return", "lr", "loss", "fps",
        "fps_mean", "time_s",
    ]  # fmt: skip
    assert rows[2]["episodes"] == "2" and float(rows[2]["episode_return"]) == 300.0
    assert float(rows[2]["recent_return"]) == 200.0  # 100, 100, 200, 200, 300, 300
    assert float(rows[2]["lr"]) == 0.8


def test_stop_after_ends_with_a_checkpoint_at_the_first_batch_past_it_and_no_curve(tmp_path, plots):
    recipe = _recipe(tmp_path)
    recipe.train(stop_after=450)
    assert recipe.collector.frames == 500
    assert _checkpoints(recipe) == [300, 500]
    assert recipe.calls[-1] == ("close", 500) and recipe.collector.shut_down
    assert plots == []  # the run is not complete


def test_a_stop_request_checkpoints_the_batch_it_came_in_and_returns(tmp_path, plots):
    recipe = _recipe(tmp_path)
    stop = StopAfterBatches(2)
    assert recipe.train(stop=stop) == tmp_path
    assert stop.asked == 2  # asked once per batch
    assert recipe.collector.frames == 200 and _checkpoints(recipe) == [200]
    assert recipe.calls[-1] == ("close", 200)
    assert len(read_metrics(tmp_path)) == 2
    assert plots == []


def test_a_stop_request_at_the_last_batch_still_completes_the_run(tmp_path, plots):
    recipe = _recipe(tmp_path)
    recipe.train(stop=StopAfterBatches(FRAMES // PER_BATCH))
    assert _checkpoints(recipe) == [300, 500, 800, 1000]  # one checkpoint at the end
    assert len(plots) == 1


def test_no_curve_without_plot(tmp_path, plots):
    _recipe(tmp_path, plot=False).train()
    assert plots == []


def test_progress_line_and_fps_are_those_of_the_last_batch(tmp_path, plots, monkeypatch, capsys):
    # a fake clock: the first batch takes 10 s (a compile, say), the next ones 0.5 s each
    times = iter([0.0, 10.0, 10.5, 11.0])
    monkeypatch.setattr(loop, "perf_counter", lambda: next(times))
    recipe = _recipe(tmp_path, quiet=False)
    recipe.train(stop_after=300)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "frames 100/1000 | 10 fps | return 100.0 (last 2 episodes) | loss 0.50",
        "frames 200/1000 | 200 fps | return 150.0 (last 4 episodes) | loss 0.50",
        "frames 300/1000 | 200 fps | return 200.0 (last 6 episodes) | loss 0.50",
    ]
    rows = read_metrics(tmp_path)
    assert [float(r["fps"]) for r in rows] == [10.0, 200.0, 200.0]
    assert [float(r["fps_mean"]) for r in rows] == [10.0, 200 / 10.5, 300 / 11.0]
    assert [float(r["time_s"]) for r in rows] == [10.0, 10.5, 11.0]


def test_quiet_prints_nothing_and_a_batch_without_episodes_logs_nan(tmp_path, plots, capsys):
    recipe = _recipe(tmp_path)
    row = recipe.episode_row([])
    assert row["episodes"] == 0 and math.isnan(row["episode_return"])
    assert math.isnan(row["recent_return"])  # nothing tracked yet
    recipe.train(stop_after=100)
    assert capsys.readouterr().out == ""


def test_a_recipe_without_its_hooks_is_refused_by_name(tmp_path):
    class Incomplete(Trainer):
        algo = "ppo"

    with pytest.raises(NotImplementedError, match=r"Incomplete must define build\(\)"):
        Incomplete(TrainConfig(env=EnvConfig(env="CartPole-v1", num_envs=ENVS),
                               run=RunConfig(run_dir=str(tmp_path))))  # fmt: skip
