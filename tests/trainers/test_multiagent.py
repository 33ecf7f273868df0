"""``recurrl train`` on multi-agent tasks: MAPPO / IPPO, recurrent and feed-forward."""

import importlib.util
import json
import re

import pytest
import torch

from recurrl.trainers.config import EnvConfig, ModelConfig, TrainConfig
from recurrl.trainers.evaluate import evaluate
from recurrl.trainers.logger import read_metrics
from recurrl.trainers.models import actor_critic, make_env
from recurrl.trainers.multiagent import MultiAgentActorCritic
from recurrl.trainers.ppo import PPOTrainer
from tests.trainers._helpers import metric_numbers, parse_train, run_cli

needs_vmas = pytest.mark.skipif(
    importlib.util.find_spec("vmas") is None, reason="the vmas extra is not installed"
)
RECALL = ["--env", "MultiAgentRecall-v0", "--num-envs", "4", "--steps-per-env", "8",
          "--frames", "64", "--epochs", "1", "--num-minibatches", "2", "--hidden-size", "8",
          "--quiet"]  # fmt: skip

VMAS = ["--env", "vmas:balance", "--max-episode-steps", "8", "--num-envs", "4",
        "--steps-per-env", "8", "--frames", "64", "--epochs", "1", "--num-minibatches", "2",
        "--hidden-size", "8", "--eval-episodes", "0", "--quiet"]  # fmt: skip


@needs_vmas
@pytest.mark.parametrize(("memory", "critic"), [("gru", "mappo"), ("lstm", "ippo"),
                                                ("none", "mappo")])  # fmt: skip
def test_train_evaluate_and_resume_a_multiagent_run(tmp_path, capsys, memory, critic):
    run_dir = tmp_path / "run"
    argv = [*VMAS, "--memory", memory, "--multiagent", critic, "--run-dir", str(run_dir)]
    run_cli(capsys, "train", *argv, "--checkpoint-every", "32")
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["ppo"]["multiagent"] == critic and saved["env"]["env"] == "vmas:balance"
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [32, 64]
    assert all(r["loss_objective"] not in ("", "nan") for r in rows)
    returns = evaluate(run_dir, episodes=2)
    assert len(returns) == 2 and all(isinstance(r, float) for r in returns)
    # a run stopped after its first batch resumes from its checkpoint (the VMAS episodes
    # start afresh: the simulator is not in the checkpoint) and has no gap or duplicate
    part = tmp_path / "part"
    cfg = parse_train(*[a if a != str(run_dir) else str(part) for a in argv])
    part.mkdir()
    (part / "config.json").write_text(json.dumps(cfg.to_dict()))
    PPOTrainer(cfg).train(stop_after=32)
    run_cli(capsys, "train", "--resume", str(part), "--quiet")
    assert [int(r["frames"]) for r in read_metrics(part)] == [32, 64]
    assert metric_numbers(part)[0] == metric_numbers(run_dir)[0]  # same seed, same batch


@needs_vmas
def test_the_model_follows_the_env_and_the_collected_batch_holds_per_agent_states():
    cfg = parse_train(*VMAS, "--memory", "gru")
    env = make_env(cfg.env, seed=0)
    model = actor_critic(cfg, env)
    assert isinstance(model, MultiAgentActorCritic)
    n_agents = env.observation_spec["agents", "observation"].shape[-2]
    from recurrl.collectors import Collector

    collector = Collector(env, model.policy(), frames_per_batch=16)
    batch = collector.rollout()
    collector.shutdown()
    assert batch["agents", "action"].shape == (4, 4, n_agents)
    assert batch["agents", "is_init"].shape == (4, 4, n_agents, 1)
    group = batch["agents"]
    states = [k for k in group.keys() if "state" in k and k != "state_value"]  # noqa: SIM118
    assert states, "the actor's per-agent hidden state must ride in the batch"
    for key in states:
        assert batch["agents", key].shape[:3] == (4, 4, n_agents)
    # the team reward is the mean of the agents' rewards
    torch.testing.assert_close(batch["next", "reward"], batch["next", "agents", "reward"].mean(-2))


@needs_vmas
def test_continuous_actions_a_squashed_gaussian_per_agent_within_the_bounds():
    """--continuous-actions builds VMAS's task with bounded action vectors: the shared actor
    writes a Gaussian per agent, the actions collected lie in the bounds, their stored
    log-probabilities are what the loss recomputes (the first PPO ratio is 1), and the
    greedy policy takes the squashed mean."""
    from recurrl.collectors import Collector
    from recurrl.modules import set_recurrent_mode

    cfg = parse_train(*VMAS, "--memory", "gru", "--continuous-actions")
    env = make_env(cfg.env, seed=0)
    spec = env.full_action_spec["agents", "action"]
    model = actor_critic(cfg, env)
    assert model.continuous and spec.shape[-1] == 2
    torch.testing.assert_close(model.action_low, spec.low.reshape(-1, 2)[0])
    torch.manual_seed(0)
    collector = Collector(env, model.policy(), frames_per_batch=16)
    batch = collector.rollout()
    collector.shutdown()
    action = batch["agents", "action"]
    n_agents = action.shape[2]
    assert action.shape == (4, 4, n_agents, 2) and action.dtype == torch.float32
    assert ((action > spec.low[0]) & (action < spec.high[0])).all()
    assert batch["agents", "sample_log_prob"].shape == (4, 4, n_agents)
    with set_recurrent_mode(True):
        params = model.actor(batch.clone())
    dist = model.distribution(params["agents", "loc"], params["agents", "scale"])
    torch.testing.assert_close(
        dist.log_prob(action), batch["agents", "sample_log_prob"], atol=1e-4, rtol=1e-4
    )
    greedy = model.policy(deterministic=True)(env.reset())
    loc = greedy["agents", "loc"]
    mid, half = (spec.high[0] + spec.low[0]) / 2, (spec.high[0] - spec.low[0]) / 2
    torch.testing.assert_close(greedy["agents", "action"], mid + half * torch.tanh(loc))


@needs_vmas
@pytest.mark.parametrize("memory", ["gru", "none"])
def test_train_evaluate_and_resume_with_continuous_actions(tmp_path, capsys, memory):
    run_dir = tmp_path / "run"
    argv = [*VMAS, "--memory", memory, "--continuous-actions", "--run-dir", str(run_dir)]
    run_cli(capsys, "train", *argv, "--checkpoint-every", "32")
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["env"]["continuous_actions"] is True
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [32, 64]
    assert all(r["loss_objective"] not in ("", "nan") for r in rows)
    assert all(abs(float(r["kl_approx"])) < 0.5 for r in rows)  # log-probs agree
    returns = evaluate(run_dir, episodes=2)
    assert len(returns) == 2 and all(isinstance(r, float) for r in returns)
    run_cli(capsys, "train", "--resume", str(run_dir), "--frames", "96", "--quiet")
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [32, 64, 96]


@pytest.mark.skipif(importlib.util.find_spec("mpe2") is None, reason="mpe2 is not installed")
def test_mpe_with_continuous_actions_trains_in_its_own_bounds(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", "--env", "mpe2:simple_spread_v3", "--continuous-actions",
            "--max-episode-steps", "8", "--num-envs", "4", "--steps-per-env", "8", "--frames",
            "32", "--epochs", "1", "--num-minibatches", "2", "--hidden-size", "8",
            "--eval-episodes", "0", "--quiet", "--run-dir", str(run_dir))  # fmt: skip
    cfg = parse_train("--env", "mpe2:simple_spread_v3", "--continuous-actions", "--num-envs", "2")
    model = actor_critic(cfg, make_env(cfg.env, seed=0))
    assert model.action_low.tolist() == [0.0] * 5 and model.action_high.tolist() == [1.0] * 5


def test_agents_with_different_action_bounds_are_refused_by_the_shared_actor():
    from types import SimpleNamespace

    from recurrl.envs import specs
    from recurrl.trainers.errors import UsageError
    from recurrl.trainers.multiagent import multiagent_actor_critic

    low = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]])  # agent 1's bounds are wider
    obs = specs.Unbounded(shape=(4, 2, 3))
    action = specs.Bounded(low=low.expand(4, 2, 2), high=-low.expand(4, 2, 2), shape=(4, 2, 2))
    env = SimpleNamespace(
        observation_spec=specs.Composite(agents=specs.Composite(observation=obs, shape=(4, 2)),
                                         shape=(4,)),
        full_action_spec=specs.Composite(agents=specs.Composite(action=action, shape=(4, 2)),
                                         shape=(4,)),
        batch_size=torch.Size([4]),
    )  # fmt: skip
    cfg = TrainConfig(env=EnvConfig(env="MultiAgentRecall-v0"))
    with pytest.raises(UsageError, match="action bounds differ between agents"):
        multiagent_actor_critic(cfg, env)
    env.full_action_spec["agents", "action"] = specs.Bounded(
        low=-torch.ones(4, 2, 2), high=torch.ones(4, 2, 2), shape=(4, 2, 2)
    )
    model = multiagent_actor_critic(cfg, env)
    assert model.continuous and model.action_high.tolist() == [1.0, 1.0]


def test_continuous_actions_are_refused_where_they_do_not_apply(capsys):
    with pytest.raises(ValueError, match="continuous_actions applies to the multi-agent tasks"):
        EnvConfig(env="Pendulum-masked", continuous_actions=True)
    with pytest.raises(ValueError, match="takes its action space from the env itself"):
        EnvConfig(env="MultiAgentRecall-v0", continuous_actions=True)
    with pytest.raises(ValueError, match="action_bounds must be finite with low < high"):
        MultiAgentActorCritic(ModelConfig(memory="gru", hidden_size=8), 3, 5, 2,
                              action_bounds=(torch.ones(2), torch.zeros(2)))  # fmt: skip
    model = MultiAgentActorCritic(ModelConfig(memory="gru", hidden_size=8), 3, 5, 4)
    with pytest.raises(ValueError, match="discrete actions"):
        model.distribution(torch.zeros(1, 3, 4), torch.ones(1, 3, 4))


@needs_vmas
def test_mappo_reads_the_global_state_and_ippo_does_not():
    env = make_env(EnvConfig(env="vmas:balance", num_envs=2), seed=0)
    mappo = actor_critic(TrainConfig(env=EnvConfig(env="vmas:balance")), env)
    ippo_cfg = TrainConfig(env=EnvConfig(env="vmas:balance"))
    ippo_cfg.ppo.multiagent = "ippo"
    ippo = actor_critic(ippo_cfg, env)
    assert "state" in mappo.critic.in_keys
    assert "state" not in ippo.critic.in_keys


@needs_vmas
@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--algo", "dqn"], "algo='dqn' is not available with a multi-agent task"),
        (["--action-std", "state"], "action_std='state' is not available.*--continuous-actions"),
        (["--obs-norm"], "obs_norm"),
        (["--obs-scale", "1"], r"obs_scale=1.0 is not available.*Fix: drop --obs-scale"),
        (["--engine", "torch"], "multi-agent task"),
        (["--multiagent", "qmix"], "invalid choice|multiagent must be"),
    ],
)
def test_what_a_multiagent_run_cannot_do_is_refused_with_the_fix(argv, match, capsys):
    with pytest.raises((ValueError, SystemExit)) as info:
        parse_train("--env", "vmas:balance", *argv)
    said = str(info.value) if info.type is not SystemExit else capsys.readouterr().err
    assert re.search(match, said), said


@needs_vmas
def test_a_memory_without_an_agent_dimension_is_refused_by_name():
    from recurrl.trainers.errors import UsageError

    env = make_env(EnvConfig(env="vmas:balance", num_envs=2), seed=0)
    cfg = TrainConfig(env=EnvConfig(env="vmas:balance"), model=ModelConfig(memory="transformer"))
    with pytest.raises(UsageError, match="no agent dimension"):
        actor_critic(cfg, env)


@needs_vmas
def test_a_multiagent_run_and_an_agent_module_are_refused_by_export(tmp_path, capsys):
    from recurrl.modules import GRUModule
    from recurrl.trainers._export_graph import _RecurrentStep
    from recurrl.trainers.export import ExportError, export_run

    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *VMAS, "--memory", "gru", "--run-dir", str(run_dir))
    with pytest.raises(ExportError, match="multi-agent task 'vmas:balance'"):
        export_run(run_dir)
    gru = GRUModule(4, 8, in_key=("agents", "observation"), out_key=("agents", "f"), n_agents=3)
    with pytest.raises(ExportError, match=r"GRUModule\(n_agents=3\)"):
        _RecurrentStep(gru)


def test_the_builtin_memory_task_trains_and_evaluates_without_optional_packages(tmp_path, capsys):
    run_dir = tmp_path / "run"
    lines = run_cli(capsys, "train", *RECALL, "--memory", "gru", "--eval-episodes", "3",
                    "--run-dir", str(run_dir))  # fmt: skip
    assert any(line.startswith("greedy evaluation: mean_return:") for line in lines)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [32, 64]
    with pytest.raises(ValueError, match="fixed length"):
        parse_train(*RECALL, "--max-episode-steps", "3")


def test_mappo_with_ray_workers(ray_session, tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = [*RECALL, "--collector", "ray", "--workers", "2", "--memory", "gru"]
    lines = run_cli(capsys, "train", *argv, "--eval-episodes", "2", "--run-dir", str(run_dir))
    assert any(line.startswith("greedy evaluation: mean_return:") for line in lines)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [32, 64]


def test_observation_keep_hides_the_same_entries_of_every_agent(tmp_path, capsys):
    keep = EnvConfig(env="MultiAgentRecall-v0", num_envs=2, observation_keep="0,2-4")
    masked, full = (make_env(c, seed=3) for c in (keep, EnvConfig(env="MultiAgentRecall-v0",
                                                                      num_envs=2)))  # fmt: skip
    assert masked.observation_spec["agents", "observation"].shape == (2, 3, 4)
    a, b = masked.rollout(5), full.rollout(5, break_when_any_done=True)
    steps = min(a.shape[1], b.shape[1])
    torch.testing.assert_close(
        a["agents", "observation"][:, :steps],
        b["agents", "observation"][:, :steps][..., [0, 2, 3, 4]],
    )
    # a run trains on what is kept: the actor reads 4 entries per agent, config.json has it
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *RECALL, "--memory", "gru", "--observation-keep", "0,2-4",
            "--eval-episodes", "1", "--run-dir", str(run_dir))  # fmt: skip
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["env"]["observation_keep"] == "0,2-4"
    assert len(evaluate(run_dir, episodes=1)) == 1


def test_observation_flicker_hides_whole_agent_views(tmp_path, capsys):
    cfg = EnvConfig(env="MultiAgentRecall-v0", num_envs=64, observation_keep="0,2-4",
                    observation_flicker=0.5)  # fmt: skip
    plain = EnvConfig(env="MultiAgentRecall-v0", num_envs=64, observation_keep="0,2-4")

    def observations(config):
        torch.manual_seed(0)  # the same random actions
        return make_env(config, seed=3).rollout(4)["agents", "observation"]  # [64, T, 3, 4]

    obs, full = observations(cfg), observations(plain)
    assert obs.shape == full.shape == (64, 4, 3, 4)
    seen = (full != 0).any(-1)  # the views that hold something
    hidden = (obs == 0).all(-1) & seen
    assert bool(((obs == full).all(-1) | hidden).all())  # a view is kept whole or hidden whole
    assert 0.3 < hidden.sum().item() / seen.sum().item() < 0.7
    assert torch.equal(obs, observations(cfg))  # the draws follow the run's seed
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *RECALL, "--memory", "gru", "--observation-flicker", "0.25",
            "--eval-episodes", "1", "--run-dir", str(run_dir))  # fmt: skip
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["env"]["observation_flicker"] == 0.25
    assert len(evaluate(run_dir, episodes=1)) == 1


def test_observation_flicker_is_checked_when_the_config_is_made():
    with pytest.raises(ValueError, match=r"in \[0, 1\).*Fix"):
        EnvConfig(env="MultiAgentRecall-v0", observation_flicker=1.0)
    with pytest.raises(ValueError, match=r"applies to multi-agent tasks.*FlickerObservation"):
        EnvConfig(env="CartPole-v1", observation_flicker=0.5)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("2-x", "indices >= 0 and ranges a-b"),
        ("3-1", "indices >= 0 and ranges a-b"),
        ("-1", "indices >= 0 and ranges a-b"),
        ("", "indices >= 0 and ranges a-b"),
        ("1,0-2", "names an entry twice"),
    ],
)
def test_observation_keep_spellings_are_checked_when_the_config_is_made(text, match):
    with pytest.raises(ValueError, match=match):
        EnvConfig(env="MultiAgentRecall-v0", observation_keep=text)


def test_observation_keep_is_refused_where_it_does_not_apply(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"applies to multi-agent tasks.*MaskObservation"):
        EnvConfig(env="CartPole-v1", observation_keep="0")
    with pytest.raises(ValueError, match=r"has 8 entries \(0-7\); entry 8 does not exist"):
        make_env(EnvConfig(env="MultiAgentRecall-v0", num_envs=2, observation_keep="5-8"), seed=0)
