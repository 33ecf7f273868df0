"""MultiDiscrete actions and Tuple observations in `recurrl train`: PPO with a product of
categoricals, the collector's policy plan, eval, resume, Ray workers, popgym's tasks."""

from __future__ import annotations

import math
import re

import pytest
import torch
from tensordict import TensorDict

from recurrl.collectors._policy_plan import plan_policy
from recurrl.modules import set_recurrent_mode
from recurrl.trainers import PPOTrainer
from recurrl.trainers.cli import main
from recurrl.trainers.logger import read_metrics

from ._helpers import check_resume_replays, parse_train, run_cli, train_tiny_lstm

ENV = "tests.trainers.multi_discrete_envs:RecurrlMultiDiscrete-v0"
# 2 envs x 64 steps per batch, 2 batches
TINY = [
    "--env", ENV, "--num-envs", "2", "--frames", "256", "--frames-per-batch", "128",
    "--num-minibatches", "2", "--epochs", "2", "--hidden-size", "8", "--quiet",
    "--eval-episodes", "0", "--no-tensorboard", "--no-plot",
]  # fmt: skip
MEAN_RETURN = re.compile(r"mean_return: (-?\d+\.\d\d) ± (\d+\.\d\d) over (\d+) episodes")


def test_first_ratio_is_one_on_a_collected_batch(tmp_path):
    cfg = parse_train(*TINY, "--memory", "gru", "--run-dir", str(tmp_path))
    trainer = PPOTrainer(cfg)
    try:
        assert trainer.model.action_nvec == (3, 2)
        batch = trainer.collector.rollout()
        action = batch["action"]
        assert action.shape == (2, 64, 2) and action.dtype == torch.int64
        assert ((action >= 0) & (action < torch.tensor([3, 2]))).all()
        assert action[..., 0].unique().numel() == 3 and action[..., 1].unique().numel() == 2
        trainer.gae(batch)
        out = trainer.loss(batch)
        assert abs(out["kl_approx"].item()) < 1e-5 and out["clip_fraction"].item() == 0.0
        # the entropy is the sum over the dimensions: log 3 + log 2 for uniform logits
        assert 0 < out["entropy"].item() <= math.log(6) + 1e-5
        stats = trainer.update(batch)
        assert all(math.isfinite(v) for v in stats.values())
    finally:
        trainer.collector.shutdown()


@pytest.mark.parametrize("memory", ["none", "lstm"])
def test_the_collectors_policy_plan_gives_the_policys_actions(tmp_path, memory):
    cfg = parse_train(*TINY, "--memory", memory, "--run-dir", str(tmp_path))
    trainer = PPOTrainer(cfg)
    try:
        policy = trainer.model.policy()
        plan = plan_policy(policy)
        assert plan is not None  # planned: the sampler is a plain network
        td = TensorDict(
            observation=torch.randn(4, 5), is_init=torch.ones(4, 1, dtype=torch.bool),
            batch_size=[4],
        )  # fmt: skip
        if memory == "lstm":
            for key in ("actor_h", "actor_c", "critic_h", "critic_c"):
                td[key] = torch.zeros(4, 1, 8)
        with torch.no_grad(), set_recurrent_mode(False):
            torch.manual_seed(0)
            expected = policy(td.clone())
            torch.manual_seed(0)
            got = plan(td.clone())
        for key in ("action", "sample_log_prob", "logits"):
            assert torch.equal(got[key], expected[key]), key
        assert got["action"].shape == (4, 2)
    finally:
        trainer.collector.shutdown()


def test_train_writes_metrics_and_checkpoint_then_eval(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rows = train_tiny_lstm(capsys, run_dir, TINY)
    assert all(0 < float(r["entropy"]) <= math.log(6) + 1e-5 for r in rows)
    for greedy in ([], ["--sample"]):
        lines = run_cli(capsys, "eval", str(run_dir), "--episodes", "3", *greedy)
        match = MEAN_RETURN.fullmatch(lines[-1])
        assert match and match.group(3) == "3", lines[-1]
        assert 0.0 <= float(match.group(1)) <= 1.0  # one reward, of 1 at most, per episode


def test_resume_replays_the_uninterrupted_run(tmp_path, capsys):
    argv = [*TINY, "--frames", "512", "--checkpoint-every", "256", "--memory", "gru"]
    check_resume_replays(capsys, tmp_path, argv, PPOTrainer, stop_after=256)


def test_dqn_with_multi_discrete_actions_is_a_one_line_usage_error(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--algo", "dqn", "--env", ENV, "--quiet", "--run-dir", str(run_dir)]
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a Discrete action space" in err
    assert "MultiDiscrete" in err and "Fix: --algo ppo" in err and not run_dir.exists()


def test_ppo_with_ray_workers(ray_session, tmp_path, capsys):
    pytest.importorskip("popgym")  # an env id the Ray workers can build (popgym-*)
    run_dir = tmp_path / "run"
    argv = [*TINY, "--env", "popgym-MineSweeperEasy-v0", "--collector", "ray", "--workers", "2"]
    lines = run_cli(capsys, "train", *argv, "--eval-episodes", "2", "--run-dir", str(run_dir))
    assert any(line.startswith("greedy evaluation: mean_return:") for line in lines)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256]
    assert run_cli(capsys, "eval", str(run_dir), "--episodes", "2")[-1].startswith("mean_return:")


@pytest.mark.parametrize(
    "env_id",
    ["popgym-BattleshipEasy-v0", "popgym-MineSweeperEasy-v0", "popgym-AutoencodeEasy-v0"],
)
def test_popgym_train_then_eval(env_id, tmp_path, capsys):
    pytest.importorskip("popgym")
    run_dir = tmp_path / "run"
    argv = [*TINY, "--env", env_id, "--memory", "gru", "--run-dir", str(run_dir)]
    assert run_cli(capsys, "train", *argv)[-1] == str(run_dir)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256]
    match = MEAN_RETURN.fullmatch(run_cli(capsys, "eval", str(run_dir), "--episodes", "2")[-1])
    assert match and math.isfinite(float(match.group(1)))
