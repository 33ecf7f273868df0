"""The recipes' collectors: local by default, Ray workers with ``--collector ray``."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from tensordict import TensorDict

from recurrl.collectors import Collector
from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.cli import main
from recurrl.trainers.collection import episode_returns, make_collector, next_batch, ray_init_config
from recurrl.trainers.config import EnvConfig, RunConfig, TrainConfig
from recurrl.trainers.dqn import DQNTrainer, EpsilonGreedy, apex_epsilons
from recurrl.trainers.evaluate import load_config
from recurrl.trainers.logger import read_metrics
from recurrl.trainers.models import make_env
from recurrl.trainers.ppo import PPOTrainer

from ._helpers import metric_numbers, parse_train, run_cli
from .test_dqn import TINY as DQN_TINY

PPO_TINY = [
    "--num-envs", "2", "--frames", "256", "--frames-per-batch", "128", "--num-minibatches", "2",
    "--epochs", "2", "--hidden-size", "8", "--quiet", "--no-plot", "--no-tensorboard",
    "--eval-episodes", "2",
]  # fmt: skip
RAY = ["--collector", "ray", "--workers", "2"]
# the fast recipe's shape on Ray workers stepping batched envs, small: 2 workers x 8 envs x
# 8 steps (128-frame batches), one epoch of 16 minibatches (one env row each)
BATCHED = [
    *RAY, "--envs-per-worker", "8", "--epochs", "1", "--num-minibatches", "16",
    "--steps-per-env", "8", "--hidden-size", "8", "--frames", "256", "--quiet", "--no-plot",
    "--no-tensorboard", "--eval-episodes", "2",
]  # fmt: skip


def test_ray_init_config_starts_a_local_ray_or_joins_an_address():
    local = ray_init_config(TrainConfig(env=EnvConfig(collector="ray", workers=4)))
    assert local["num_cpus"] >= 4 and local["include_dashboard"] is False
    assert "address" not in local
    joined = ray_init_config(
        TrainConfig(env=EnvConfig(collector="ray"), run=RunConfig(ray_address="ray://h:10001"))
    )
    assert joined["address"] == "ray://h:10001" and "num_cpus" not in joined


def test_the_local_collector_is_the_default():
    cfg = TrainConfig()
    env = make_env(cfg.env, seed=0)
    n = cfg.env.num_envs
    collector = make_collector(cfg, env, None, frames_per_batch=2 * n, total_frames=4 * n,
                               device="cpu")  # fmt: skip
    assert type(collector) is Collector and collector.env is not None
    trainer = type("T", (), {"collector": collector})()
    assert next_batch(trainer).shape == (n, 2)
    assert next_batch(trainer).shape == (n, 2)
    with pytest.raises(StopIteration):
        next_batch(trainer)
    collector.shutdown()


def test_ray_collector_without_ray_is_a_one_line_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    run_dir = tmp_path / "run"
    assert main(["train", *PPO_TINY, *RAY, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'pip install "recurrl[ray]"' in err[0]
    assert not run_dir.exists()  # a failed start leaves no half-made run


def test_epsilon_travels_in_the_policy_state_dict():
    greedy = EpsilonGreedy(0.5)
    greedy.epsilon = 0.125
    other = EpsilonGreedy(1.0)
    other.load_state_dict(greedy.state_dict())
    assert other.epsilon == 0.125
    other.load_state_dict({})  # a state dict from before epsilon was a buffer
    assert other.epsilon == 0.125


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--envs-per-worker", "8"], "--envs-per-worker only applies with --collector ray"),
        ([*RAY, "--envs-per-worker", "8", "--num-envs", "12"], "8 = 16 envs, but num_envs=12"),
        ([*RAY, "--num-envs", "7"], "num_envs=7 does not split over workers=2"),
        ([*RAY, "--engine", "torch", "--env", "Acrobot-v1"], "has none (those that do: ["),
        ([*RAY, "--envs-per-worker", "8", "--frames-per-batch", "100"], "not a multiple of"),
    ],
)
def test_bad_ray_and_engine_combinations_are_one_line_errors(tmp_path, capsys, argv, message):
    assert main(["train", *argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Fix:" in err[0]
    assert not (tmp_path / "run").exists()


def _stepping_env(env) -> str:
    """Class name of the env below the transforms (the engine's)."""
    while hasattr(env, "base_env"):
        env = env.base_env
    return type(env).__name__


# ---------------------------------------------------------------------- with Ray
def test_ppo_with_ray_workers_collects_on_policy(ray_session, tmp_path):
    cfg = parse_train(*PPO_TINY, *RAY, "--frames", "384", "--run-dir", str(tmp_path / "run"))
    trainer = PPOTrainer(cfg)
    try:
        versions = []
        for _ in range(3):
            batch = next_batch(trainer)
            assert batch.shape == (2, 64)  # one env row per worker, 64 steps each
            assert batch["collector", "worker_id"][:, 0].tolist() == [0, 1]
            version = batch["collector", "policy_version"]
            assert (version == version[0, 0]).all()  # one weights version per batch
            versions.append(int(version[0, 0]))
            trainer.update(batch)
        # the weights are sent after each update and used for the whole next batch
        assert versions == [versions[0], versions[0] + 1, versions[0] + 2]
        ids = batch["collector", "traj_ids"]
        assert set(ids[0].tolist()).isdisjoint(ids[1].tolist())  # unique across workers
    finally:
        trainer.collector.shutdown()


def test_ppo_trains_resumes_and_evaluates_with_ray_workers(ray_session, tmp_path, capsys):
    run_dir = tmp_path / "run"
    gym = ["--engine", "gymnasium"]  # simulators that live in the workers only
    lines = run_cli(capsys, "train", *PPO_TINY, *RAY, *gym, "--run-dir", str(run_dir))
    assert lines[-1] == str(run_dir)
    assert any(line.startswith("greedy evaluation: mean_return:") for line in lines)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256]
    state = ckpt.load(run_dir)  # weights-only and digest-checked, like a local run's
    assert state["frames"] == 256 and len(state["collector"]["workers"]) == 2
    assert load_config(run_dir).env.collector == "ray"

    assert main(["train", "--resume", str(run_dir), "--frames", "384"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any("warning:" in line and "new episodes" in line for line in err)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256, 384]
    assert ckpt.load(run_dir)["frames"] == 384
    assert run_cli(capsys, "eval", str(run_dir), "--episodes", "2")[-1].startswith("mean_return:")


@pytest.mark.parametrize(
    ("engine", "expected"), [("auto", "CartPoleEnv"), ("gymnasium", "GymVecEnv")]
)
def test_ray_workers_step_the_engine_of_the_local_path(ray_session, tmp_path, engine, expected):
    """``--engine`` reaches the workers: each builds the env the local path would build
    (auto: recurrl's batched torch CartPole), and carries ids, ``is_init`` and hidden
    states across partial resets and batches as the local collector does."""
    cfg = parse_train(*BATCHED, "--engine", engine, "--run-dir", str(tmp_path / "run"))
    local = make_env(cfg.env, num_envs=cfg.env.worker_envs())
    assert _stepping_env(local) == expected
    local.close()
    trainer = PPOTrainer(cfg)
    try:
        info = [(w["env"], w["num_envs"], w["env_device"]) for w in trainer.collector.worker_info]
        assert info == [(expected, 8, "cpu")] * 2
        if engine != "auto":
            return
        first = next_batch(trainer)
        trainer.update(first.clone())  # the update writes its own keys into the batch
        second = next_batch(trainer)
    finally:
        trainer.collector.shutdown()
    batch = torch.cat([first, second], dim=1)  # [16 envs, 16 steps]
    assert first.shape == (16, 8) and batch["collector", "policy_version"][:, 8:].eq(1).all()
    is_init = batch["is_init"].squeeze(-1)
    assert is_init[:, 0].all()
    ids = batch["collector", "traj_ids"]
    assert torch.equal(ids[:, 1:] != ids[:, :-1], is_init[:, 1:])  # a new id at each is_init
    stride = 2 + cfg.run.max_restarts  # RayCollector: slot s hands out s + stride * k
    assert (ids % stride == torch.arange(2).repeat_interleave(8)[:, None]).all()  # per worker
    roots = first.keys(include_nested=False)  # iterating a TensorDict walks its rows
    states = [k for k in roots if k.endswith(("_h", "_c")) and ("next", k) in first.keys(True)]
    assert len(states) == 4  # actor and critic LSTM states
    for key in states:
        assert not batch[key][is_init].any()  # zeros at every start
        go_on = ~is_init[:, 8]  # carried from the first batch to the second
        assert torch.equal(second[key][:, 0][go_on], first["next", key][:, -1][go_on])


def test_the_fast_recipe_trains_on_ray_workers_and_resumes_exactly(ray_session, tmp_path, capsys):
    """``recurrl train --collector ray --workers 2 --envs-per-worker K --epochs 1
    --num-minibatches 16``, small: trains and evaluates; each worker's torch envs are
    checkpointed as tensors with its RNG, so a resumed run goes on with the same episodes
    and replays the uninterrupted one number for number."""
    argv = [*BATCHED, "--frames", "384", "--checkpoint-every", "128"]
    lines = run_cli(capsys, "train", *argv, "--run-dir", str(tmp_path / "full"))
    assert any(line.startswith("greedy evaluation: mean_return:") for line in lines)
    assert [int(r["frames"]) for r in read_metrics(tmp_path / "full")] == [128, 256, 384]
    cut = tmp_path / "cut"
    cfg = parse_train(*argv, "--run-dir", str(cut))
    cut.mkdir()
    (cut / "config.json").write_text(json.dumps(cfg.to_dict()))
    PPOTrainer(cfg).train(stop_after=256)
    workers = ckpt.load(cut)["collector"]["workers"]
    assert all({"simulator_tensors", "rng"} <= set(w) for w in workers)
    assert all(w["collector"]["root"] is not None for w in workers)
    run_cli(capsys, "train", "--resume", str(cut))
    assert "new episodes" not in capsys.readouterr().err
    assert metric_numbers(cut) == metric_numbers(tmp_path / "full")


def test_a_ray_checkpoint_does_not_resume_with_the_local_collector(ray_session, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *PPO_TINY, *RAY, "--run-dir", str(run_dir))
    cfg = load_config(run_dir)
    local = TrainConfig.from_dict({**cfg.to_dict(), "env": {**cfg.to_dict()["env"],
                                                             "collector": "local"}})  # fmt: skip
    with pytest.raises(ckpt.CheckpointError, match="ray collector"):
        PPOTrainer(local, resume=True)


def test_dqn_workers_write_into_the_ray_replay_buffer(ray_session, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *DQN_TINY, *RAY, "--run-dir", str(run_dir))
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [64, 128, 192, 256]
    assert all(math.isfinite(float(r["loss"])) for r in rows[1:])  # learning from 128 frames
    state = ckpt.load(run_dir)
    assert state["extra"]["normalized"]  # obs_norm fitted from the remote buffer's frames

    cfg = load_config(run_dir)
    cfg.dqn.frames = 384
    trainer = DQNTrainer(cfg, resume=True)
    try:
        assert len(trainer.buffer) == 256  # the buffer came back from the checkpoint
        scale = trainer.model.obs_norm.scale
        assert not torch.equal(scale, torch.ones_like(scale))
        trainer.train()  # shuts the collector and the buffer down at the end
    finally:
        trainer.collector.shutdown()
        trainer.buffer.shutdown()
    assert [int(r["frames"]) for r in read_metrics(run_dir)][-2:] == [320, 384]


def test_the_ray_buffer_actor_draws_from_the_replay_seed(ray_session, tmp_path):
    cfg = parse_train(*DQN_TINY, *RAY, "--replay-seed", "5", "--run-dir", str(tmp_path / "r"))
    trainer = DQNTrainer(cfg)
    try:
        state = trainer.buffer.state_dict()["sampler"]["generator"]
        assert torch.equal(state, torch.Generator().manual_seed(5).get_state())
    finally:
        trainer.collector.shutdown()
        trainer.buffer.shutdown()


def test_apex_ray_workers_keep_their_own_epsilon_through_weight_syncs(
    ray_session, tmp_path, capsys
):
    """Worker 0 explores with epsilon 0.5, worker 1 with 0.5 ** 61 (~4e-19, greedy); the
    weights are synced after every batch and every step the workers stored says whose
    epsilon chose it: worker 1 never left the argmax, worker 0 about a quarter of the time
    (0.5 x 1/2 for CartPole's two actions)."""
    run_dir = tmp_path / "run"
    out = run_cli(capsys, "train", *DQN_TINY, *RAY, "--frames", "512", "--epsilon-schedule",
                  "apex", "--apex-epsilon", "0.5", "--apex-alpha", "60", "--no-quiet",
                  "--run-dir", str(run_dir))  # fmt: skip
    assert "epsilons (apex, per Ray worker): 0.5 4.337e-19" in out
    storage = ckpt.load(run_dir)["extra"]["buffer"]["storage"]
    data = storage["data"]  # the buffer actor's plain form of its TensorDict
    steps = TensorDict(data["__tensordict__"], batch_size=data["batch_size"])[: storage["len"]]
    assert steps.numel() == 512
    other = steps["action"] != steps["action_value"].argmax(-1)
    worker = steps["collector", "worker_id"]
    version = steps["collector", "policy_version"]
    # syncs reached both workers; how many batches each one got depends on Ray's scheduling
    # (the workers run ahead of the learner), so only the total number of syncs is fixed
    assert all(int(version[worker == w].max()) >= 1 for w in (0, 1))
    assert int(version.max()) >= 3
    assert not other[worker == 1].any()
    assert 0.12 < float(other[worker == 0].float().mean()) < 0.4
    assert float(read_metrics(run_dir)[0]["epsilon"]) == pytest.approx(0.25)
    assert apex_epsilons(2, 0.5, 60.0)[1] < 1e-18


def test_per_worker_policies_need_the_ray_collector_and_one_per_worker():
    cfg = TrainConfig()
    with pytest.raises(ValueError, match=r"one per Ray worker.*collector='local'"):
        make_collector(cfg, None, [None, None], frames_per_batch=8, total_frames=8,
                       device="cpu")  # fmt: skip


def test_episode_returns_read_at_done_steps():
    batch = TensorDict(
        {
            "next": {
                "done": torch.tensor([[False, True, False], [False, False, True]]).unsqueeze(-1),
                "episode_reward": torch.tensor([[1.0, 2.0, 1.0], [1.0, 2.0, 3.0]]).unsqueeze(-1),
            }
        },
        [2, 3],
    )
    assert sorted(episode_returns(batch)) == [2.0, 3.0]
