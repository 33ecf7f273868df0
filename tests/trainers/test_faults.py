"""Runs that survive faults: replaced Ray workers, checkpoints by time, a restarted learner."""

from __future__ import annotations

import re

import pytest

from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers import loop
from recurrl.trainers.cli import _prog, main
from recurrl.trainers.config import RunConfig
from recurrl.trainers.logger import read_metrics
from recurrl.trainers.ppo import PPOTrainer
from tests._ray_kill import is_dead, kill_and_wait

from ._helpers import parse_train

TINY = [
    "--num-envs", "2", "--frames-per-batch", "128", "--num-minibatches", "2", "--epochs", "1",
    "--hidden-size", "8", "--quiet", "--no-plot", "--no-tensorboard", "--eval-episodes", "0",
]  # fmt: skip
RAY = ["--collector", "ray", "--workers", "2"]


# ---------------------------------------------------------------------- checkpoints by time
def test_checkpoints_follow_the_clock_as_well_as_the_frames(tmp_path, monkeypatch):
    """With ``checkpoint_every_s=150`` and a fake clock that advances 100 s per batch, the
    checkpoints fall on batches 2, 4 (150 s passed since the last one) and 6 (the last)."""
    now = [0.0]
    monkeypatch.setattr(loop, "monotonic", lambda: now[0])
    saved: list[int] = []

    class Clocked(PPOTrainer):
        def learn(self, batch, logged):
            now[0] += 100.0
            return super().learn(batch, logged)

        def checkpoint(self):
            saved.append(self.batches)
            super().checkpoint()

    argv = [*TINY, "--frames", "768", "--checkpoint-every", "100000"]
    cfg = parse_train(*argv, "--checkpoint-every-s", "150", "--run-dir", str(tmp_path / "a"))
    Clocked(cfg).train()
    assert saved == [2, 4, 6]
    saved.clear()
    Clocked(parse_train(*argv, "--run-dir", str(tmp_path / "b"))).train()  # by frames only
    assert saved == [6]


@pytest.mark.parametrize("value", [0.0, -5.0])
def test_checkpoint_every_s_must_be_positive(value):
    with pytest.raises(ValueError, match="checkpoint_every_s must be > 0"):
        RunConfig(checkpoint_every_s=value)


def test_restart_options_are_checked():
    with pytest.raises(ValueError, match="max_restarts must be >= 0"):
        RunConfig(max_restarts=-1)
    with pytest.raises(ValueError, match="max_restarts_per_minute must be an int >= 1"):
        RunConfig(max_restarts_per_minute=0)
    with pytest.raises(ValueError, match="placement_timeout_s must be >= 0"):
        RunConfig(placement_timeout_s=-1.0)
    assert RunConfig(placement_timeout_s=None).placement_timeout_s is None


# ---------------------------------------------------------------------- a readable failure
def test_a_failure_after_a_checkpoint_says_what_was_saved_and_how_to_resume(
    tmp_path, capsys, monkeypatch
):
    def broken(self, batch):
        if self.batches == 2:
            raise RuntimeError("out of memory in the update\nsecond line")
        return original(self, batch)

    original = PPOTrainer.update
    monkeypatch.setattr(PPOTrainer, "update", broken)
    run_dir = tmp_path / "run"
    argv = [*TINY, "--frames", "640", "--checkpoint-every", "128", "--run-dir", str(run_dir)]
    assert main(["train", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("recurrl train: the run stopped: RuntimeError: out of memory in ")
    assert f"Saved: {run_dir / 'checkpoint.pt'} (frame 256)" in err[0]
    resume = f"{_prog()} train --resume {run_dir}"
    assert err[0].endswith(f"Full traceback: {run_dir / 'error.log'}. Resume with: {resume}")
    assert "second line" in (run_dir / "error.log").read_text()
    monkeypatch.setattr(PPOTrainer, "update", original)
    assert main(["train", "--resume", str(run_dir)]) == 0  # the printed command works
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256, 384, 512, 640]


# ---------------------------------------------------------------------- Ray workers
def _kill_worker_before_batch(ray, monkeypatch, n: int) -> None:
    """Kill Ray worker 0's actor (by its handle) before the ``n``-th batch is collected."""
    calls = [0]
    original = loop.next_batch

    def kill_first(trainer):
        calls[0] += 1
        if calls[0] == n:
            handle = trainer.collector._workers[0].handle
            ray.kill(handle, no_restart=True)
            assert is_dead(ray, handle)
        return original(trainer)

    monkeypatch.setattr(loop, "next_batch", kill_first)


@pytest.mark.slow
def test_a_killed_ray_worker_is_replaced_and_counted(
    ray_session, tmp_path, capsys, monkeypatch, fail_after
):
    """``recurrl train --collector ray --workers 2``: worker 0's actor is killed before the
    second batch; the run completes (exit 0), the replacement is one line on stderr, a
    ``worker_restarts`` column in metrics.csv and an entry of ``error.log``."""
    _kill_worker_before_batch(ray_session, monkeypatch, 2)
    run_dir = tmp_path / "run"
    with fail_after(240):
        assert main(["train", *TINY, *RAY, "--frames", "512", "--run-dir", str(run_dir)]) == 0
    err = capsys.readouterr().err.splitlines()
    replaced = [line for line in err if "Replaced by a new actor" in line]
    assert len(replaced) == 1, err
    assert "remote collector 0 (slot 0) died" in replaced[0]
    assert "replacement 1 of 3" in replaced[0]
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [128, 256, 384, 512]
    assert [int(r["worker_restarts"]) for r in rows] == [0, 1, 1, 1]
    log = (run_dir / "error.log").read_text()
    assert "a Ray worker was replaced" in log and "remote collector 0 (slot 0) died" in log
    collector = ckpt.load(run_dir)["collector"]
    assert collector["restarts"] == 1
    assert [w["slot"] for w in collector["workers"]] == [2, 1]  # a new slot: new traj ids


@pytest.mark.slow
def test_a_worker_failing_again_within_the_minute_ends_the_run(ray_session, fail_after):
    """The rate limit: with ``max_restarts_per_minute=1`` the second failure within a minute
    is not replaced (the budget, 3, would allow it) and everything is shut down."""
    import functools

    from recurrl.collectors import RayCollector, RemoteCollectorError
    from recurrl.testing import CountingEnv

    make_env = functools.partial(CountingEnv, batch_size=(2,), max_steps=3)
    with fail_after(120):
        collector = RayCollector(
            make_env, frames_per_batch=8, total_frames=80, num_collectors=2, max_restarts=3,
            max_restarts_per_minute=1, update_after_each_batch=True,
        )  # fmt: skip
        it = iter(collector)
        with pytest.raises(RemoteCollectorError, match="max_restarts_per_minute=1"):
            for _ in range(2):
                next(it)
                ray_session.kill(collector._workers[0].handle, no_restart=True)
                assert is_dead(ray_session, collector._workers[0].handle)
                next(it)
    assert collector.restarts == 1
    with pytest.raises(ValueError, match="max_restarts_per_minute None or an int >= 1"):
        RayCollector(make_env, frames_per_batch=8, max_restarts_per_minute=0)


# ---------------------------------------------------------------------- the learner restarts
@pytest.mark.slow
def test_a_learner_killed_twice_is_resumed_and_its_metrics_have_no_gap(
    tmp_path, capsys, monkeypatch, fail_after
):
    """``--resume-on-failure 2``: the first child SIGKILLs itself right after batch 3 was
    logged (before its checkpoint), the second after batch 4 was; each restart resumes from
    the checkpoint before, so the rows of metrics.csv past it are written again, once."""
    from recurrl.trainers.supervisor import KILL_HOOK_ENV

    monkeypatch.setenv(KILL_HOOK_ENV, "3,4")
    run_dir = tmp_path / "run"
    argv = [*TINY, "--frames", "640", "--checkpoint-every", "256", "--run-dir", str(run_dir)]
    with fail_after(300):
        assert main(["train", *argv, "--resume-on-failure", "2"]) == 0
    err = capsys.readouterr().err.splitlines()
    restarts = [line for line in err if "was killed by SIGKILL" in line]
    assert len(restarts) == 2, err
    assert "resuming from its last checkpoint (restart 1 of 2)" in restarts[0]
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256, 384, 512, 640]
    assert [int(r["batch"]) for r in read_metrics(run_dir)] == [1, 2, 3, 4, 5]
    assert ckpt.load(run_dir)["frames"] == 640


@pytest.mark.slow
def test_restarts_are_bounded_and_the_last_failure_says_how_to_resume(
    tmp_path, capsys, monkeypatch, fail_after
):
    from recurrl.trainers.supervisor import KILL_HOOK_ENV

    monkeypatch.setenv(KILL_HOOK_ENV, "2,3")
    run_dir = tmp_path / "run"
    argv = [*TINY, "--frames", "640", "--checkpoint-every", "128", "--run-dir", str(run_dir)]
    with fail_after(300):
        assert main(["train", *argv, "--resume-on-failure", "1"]) == 128 + 9
    err = capsys.readouterr().err
    assert "restart 1 of 1" in err and "no restart left (--resume-on-failure 1)" in err
    assert f"Resume with: {_prog()} train --resume {run_dir}" in err
    assert ckpt.load(run_dir)["frames"] == 256  # batch 3 was logged, not checkpointed


@pytest.mark.slow
def test_a_worker_lost_without_budget_ends_the_run_with_one_paragraph(
    ray_session, tmp_path, capsys, monkeypatch, fail_after
):
    _kill_worker_before_batch(ray_session, monkeypatch, 3)
    run_dir = tmp_path / "run"
    argv = [*TINY, *RAY, "--frames", "512", "--max-restarts", "0", "--checkpoint-every", "128"]
    with fail_after(240):
        assert main(["train", *argv, "--run-dir", str(run_dir)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "the run stopped: Ray worker 0 failed (RayCollector: remote collector 0 died" in err[0]
    assert "(frame 256)" in err[0] and f"Resume with: {_prog()} train --resume {run_dir}" in err[0]
    assert "remote collector 0 died" in (run_dir / "error.log").read_text()


@pytest.mark.slow
def test_a_supervised_resume_is_still_refused_while_another_learner_holds_the_run(
    tmp_path, capsys
):
    from recurrl.trainers.run_lock import lock_run_dir

    run_dir = tmp_path / "run"
    assert main(["train", *TINY, "--frames", "128", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    with lock_run_dir(run_dir):  # a live learner on the run
        argv = ["train", "--resume", str(run_dir), "--frames", "256", "--resume-on-failure", "2"]
        assert main(argv) == 2  # the child's usage error: not restarted
    assert "restart" not in capsys.readouterr().err
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128]


# ---------------------------------------------------------------------- the replay actor
def _kill_replay_actor_before_batch(ray, monkeypatch, n: int) -> None:
    """Kill the Ray replay buffer's actor (by its handle) before the ``n``-th batch."""
    calls = [0]
    original = loop.next_batch

    def kill(trainer):
        calls[0] += 1
        if calls[0] == n:
            kill_and_wait(ray, trainer.buffer._actor)
        return original(trainer)

    monkeypatch.setattr(loop, "next_batch", kill)


@pytest.mark.slow
@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_killed_replay_actor_is_rebuilt_and_learning_waits_for_its_refill(
    ray_session, tmp_path, capsys, monkeypatch, fail_after, checkpointed
):
    """DQN with ``--collector ray``: the buffer's actor is killed before the 4th batch. The
    run completes; one line on stderr; ``replay_restarts`` counts it; error.log has Ray's
    account. With a checkpoint (frame 128: at least 128 steps saved, enough to learn from) the
    updates go on at once; without one the buffer starts empty (the rule for when the
    updates resume is pinned by the next test) and the run still completes and learns."""
    from .test_dqn import TINY as DQN_TINY

    _kill_replay_actor_before_batch(ray_session, monkeypatch, 4)
    run_dir = tmp_path / "run"
    every = "128" if checkpointed else "100000"
    argv = [*DQN_TINY, *RAY, "--frames", "640", "--checkpoint-every", every]
    with fail_after(240):
        assert main(["train", *argv, "--run-dir", str(run_dir)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "rebuilt as" in line]
    assert len(err) == 1, err
    assert "the buffer's actor died" in err[0] and "(restart 1 of 3)" in err[0]
    # (the workers write ahead of the learner: the checkpoint of frame 128 holds >= 128 steps)
    filled = r"refilled with \d+ steps" if checkpointed else r"it starts empty \(no saved contents"
    assert re.search(filled, err[0]), err[0]
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == list(range(64, 641, 64))
    assert [int(r["replay_restarts"]) for r in rows] == [0, 0, 0] + [1] * 7
    learned = [r["loss"] != "" for r in rows]  # NaN (no update) is written as ""
    assert learned[:3] == [False, True, True], learned
    if checkpointed:  # refilled from the checkpoint: no pause at all
        assert all(learned[3:]), learned
    else:
        # without a checkpoint the pause lasts until the rebuilt buffer holds learning_starts
        # (128) steps; how many batches that takes depends on which of the workers' in-flight
        # writes reached the dead actor (the rule itself is pinned by the next test). Learning
        # resumes before the run ends and, once resumed, does not pause again.
        resumed = learned.index(True, 3)
        assert all(learned[resumed:]) and resumed <= len(learned) - 2, learned
    assert "the replay buffer's actor was rebuilt" in (run_dir / "error.log").read_text()


class _RebuiltBuffer:
    """What the DQN learner sees of a RayReplayBuffer: ``restarts`` and ``len``; its
    ``sample`` fails when it is empty, as an empty rebuilt buffer's does."""

    def __init__(self, steps: int) -> None:
        self.restarts, self.steps = 0, steps

    def __len__(self) -> int:
        return self.steps

    def sample(self):
        raise RuntimeError("cannot sample from an empty buffer")


def test_after_a_rebuild_learning_waits_until_the_buffer_holds_learning_starts(tmp_path):
    """The refill rule of a rebuilt Ray buffer (``DQNTrainer._watch_replay``): learning waits
    while it holds fewer than ``learning_starts`` steps (128 here) and resumes at 128; a
    rebuild noticed by a sample (an empty buffer) stops that batch's updates."""
    from recurrl.trainers.dqn import DQNTrainer

    from .test_dqn import TINY as DQN_TINY

    trainer = DQNTrainer(parse_train(*DQN_TINY, "--run-dir", str(tmp_path / "r")))
    try:
        trainer.remote, trainer.buffer = True, _RebuiltBuffer(200)
        trainer._watch_replay()
        assert not trainer.refilling
        trainer.buffer.restarts, trainer.buffer.steps = 1, 64  # rebuilt: 64 steps so far
        trainer._watch_replay()
        assert trainer.refilling
        trainer.buffer.steps = 127
        trainer._watch_replay()
        assert trainer.refilling
        trainer.buffer.steps = 128
        trainer._watch_replay()
        assert not trainer.refilling
        trainer.buffer.restarts = 2  # rebuilt empty while sampling
        assert trainer._sample() is None and trainer.refilling
        trainer.refilling = False
        with pytest.raises(RuntimeError, match="empty buffer"):  # not rebuilt: a real error
            trainer._sample()
    finally:
        trainer.collector.shutdown()
