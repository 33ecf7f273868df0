"""Continuous (Box) actions in `recurrl train`: the squashed Gaussian head, PPO, eval, resume."""

from __future__ import annotations

import math
import re

import pytest
import torch
from tensordict import TensorDict

from recurrl.trainers import PPOTrainer
from recurrl.trainers.cli import main
from recurrl.trainers.config import EnvConfig, ModelConfig, RunConfig, TrainConfig
from recurrl.trainers.models import (
    ActorCritic,
    GaussianParams,
    make_env,
)

from ._helpers import check_resume_replays, parse_train, run_cli, train_tiny_lstm

# 2 envs x 64 steps per batch, 2 batches
TINY = [
    "--env", "Pendulum-masked", "--num-envs", "2", "--frames", "256",
    "--frames-per-batch", "128", "--num-minibatches", "2", "--epochs", "2",
    "--hidden-size", "8", "--quiet", "--eval-episodes", "0", "--no-tensorboard",
]  # fmt: skip

LOW, HIGH = torch.tensor([-1.0, 0.0]), torch.tensor([3.0, 0.5])


def _model(memory: str = "none", action_std: str = "parameter") -> ActorCritic:
    cfg = ModelConfig(memory=memory, hidden_size=8, action_std=action_std)
    return ActorCritic(cfg, 3, 2, action_bounds=(LOW, HIGH))


# ---------------------------------------------------------------- the head
@pytest.mark.parametrize("memory", ["none", "lstm"])
def test_greedy_action_is_the_squashed_rescaled_mean(memory):
    torch.manual_seed(0)
    model = _model(memory)
    td = TensorDict(observation=torch.randn(4, 3), is_init=torch.ones(4, 1, dtype=torch.bool))
    td.batch_size = [4]
    out = model.policy(deterministic=True)(td.clone())
    expected = (HIGH + LOW) / 2 + (HIGH - LOW) / 2 * torch.tanh(out["loc"])
    torch.testing.assert_close(out["action"], expected)
    sampled = model.policy()(td.clone())["action"]
    assert sampled.shape == (4, 2) and sampled.dtype == torch.float32
    assert not torch.allclose(sampled, out["action"])


def test_the_stored_log_prob_is_what_the_loss_recomputes():
    torch.manual_seed(0)
    model = _model()
    td = model.policy()(TensorDict(observation=torch.randn(6, 3), batch_size=[6]))
    recomputed = model.distribution(td["loc"], td["scale"]).log_prob(td["action"])
    torch.testing.assert_close(recomputed, td["sample_log_prob"])


def test_scale_is_a_parameter_or_a_head_output():
    torch.manual_seed(0)
    obs = TensorDict(observation=torch.randn(5, 3), batch_size=[5])
    fixed = _model(action_std="parameter")
    names = [n for n, _ in fixed.named_parameters()]
    assert any(n.endswith("log_std") for n in names)
    scale = fixed.actor(obs.clone())["scale"]
    assert scale.shape == (5, 2) and torch.equal(scale, torch.ones(5, 2))  # exp(0) at start
    per_state = _model(action_std="state")
    assert not any(n.endswith("log_std") for n, _ in per_state.named_parameters())
    scale = per_state.actor(obs.clone())["scale"]
    assert scale.shape == (5, 2) and not torch.allclose(scale[0], scale[1])
    _, scale = GaussianParams(2, state_scale=True)(torch.full((1, 4), 50.0))
    assert scale.max().item() == pytest.approx(math.exp(2.0))  # log-std clamped to [-5, 2]


def test_bad_bounds_are_refused_at_construction():
    cfg = ModelConfig(hidden_size=8)
    with pytest.raises(ValueError, match="finite with low < high"):
        ActorCritic(cfg, 3, 1, action_bounds=(torch.tensor([-math.inf]), torch.tensor([1.0])))
    with pytest.raises(ValueError, match=r"two \[2\] tensors"):
        ActorCritic(cfg, 3, 2, action_bounds=(torch.zeros(1), torch.ones(1)))
    with pytest.raises(ValueError, match="discrete action"):
        ActorCritic(cfg, 3, 2).distribution(torch.zeros(2), torch.ones(2))


# ---------------------------------------------------------------- env and config
def test_pendulum_masked_hides_the_angular_velocity():
    env = make_env(EnvConfig(env="Pendulum-masked", num_envs=2), seed=0)
    try:
        assert env.observation_spec["observation"].shape == (2, 2)
        assert env.action_spec.shape == (2, 1) and env.action_spec.dtype == torch.float32
        td = env.reset()
        cos, sin = td["observation"].unbind(-1)
        torch.testing.assert_close(cos**2 + sin**2, torch.ones(2))
    finally:
        env.close()


def test_dqn_with_continuous_actions_is_a_one_line_usage_error(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--algo", "dqn", "--env", "Pendulum-masked", "--quiet", "--run-dir", str(run_dir)]
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a Discrete action space" in err
    assert "Fix: --algo ppo" in err and not run_dir.exists()


def test_action_std_on_discrete_actions_is_refused():
    with pytest.raises(ValueError, match=r"continuous \(Box\) actions only.*drop --action-std"):
        TrainConfig(model=ModelConfig(action_std="state"))


def test_popgym_position_only_pendulum(tmp_path):
    pytest.importorskip("popgym")
    cfg = TrainConfig(
        env=EnvConfig(env="popgym-PositionOnlyPendulumEasy-v0", num_envs=4),
        run=RunConfig(run_dir=str(tmp_path), tensorboard=False, plot=False, quiet=True),
    )
    trainer = PPOTrainer(cfg)
    try:
        assert trainer.model.continuous
    finally:
        trainer.collector.shutdown()


# ---------------------------------------------------------------- end to end
def test_first_ratio_is_one_on_a_collected_batch(tmp_path):
    cfg = parse_train(*TINY, "--action-std", "state", "--run-dir", str(tmp_path))
    trainer = PPOTrainer(cfg)
    try:
        batch = trainer.collector.rollout()
        assert batch["action"].shape == (2, 64, 1)
        assert ((batch["action"] >= -2) & (batch["action"] <= 2)).all()
        trainer.gae(batch)
        out = trainer.loss(batch)
        assert abs(out["kl_approx"].item()) < 1e-5 and out["clip_fraction"].item() == 0.0
    finally:
        trainer.collector.shutdown()


def test_train_writes_metrics_and_checkpoint_then_eval(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train_tiny_lstm(capsys, run_dir, TINY)
    lines = run_cli(capsys, "eval", str(run_dir), "--episodes", "2")
    match = re.fullmatch(r"mean_return: (-\d+\.\d\d) ± (\d+\.\d\d) over 2 episodes", lines[-1])
    assert match, lines[-1]
    assert -16.3 * 200 <= float(match.group(1)) <= 0  # Pendulum: reward in [-16.3, 0] per step


@pytest.mark.parametrize("extra", [[], ["--memory", "gru", "--action-std", "state"]])
def test_resume_replays_the_uninterrupted_run(tmp_path, capsys, extra):
    argv = [*TINY, "--frames", "512", "--checkpoint-every", "256", *extra]
    check_resume_replays(capsys, tmp_path, argv, PPOTrainer, stop_after=256)
