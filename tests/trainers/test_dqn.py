"""The recurrent DQN recipe: config, `recurrl train --algo dqn`, reproducibility, resume, eval."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from tensordict import TensorDict

from recurrl.trainers import DQNConfig, DQNTrainer, EnvConfig, TrainConfig, load_config
from recurrl.trainers.cli import main
from recurrl.trainers.config import field_docs
from recurrl.trainers.dqn import EpsilonGreedy, QNetwork, apex_epsilons, epsilon_at
from recurrl.trainers.logger import read_metrics

from ._helpers import (
    StopAfterBatches,
    check_resume_replays,
    metric_numbers,
    parse_train,
    run_cli,
)

# 2 envs x 32 steps per batch, 4 batches, updates from the second batch: about a second
TINY = [
    "--algo", "dqn", "--num-envs", "2", "--frames", "256", "--frames-per-batch", "64",
    "--learning-starts", "128", "--updates-per-batch", "2", "--num-slices", "4",
    "--burn-in", "4", "--train-len", "8", "--hidden-size", "8", "--quiet", "--no-plot",
    "--no-tensorboard", "--eval-episodes", "0",
]  # fmt: skip


def test_every_dqn_field_has_a_docstring():
    docs = field_docs(DQNConfig)
    for f in dataclasses.fields(DQNConfig):
        assert docs.get(f.name), f"DQNConfig.{f.name} has no docstring"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: DQNConfig(frames=1000, frames_per_batch=400), r"Fix: --frames 800"),
        (lambda: DQNConfig(burn_in=-1), "burn_in"),
        (lambda: DQNConfig(eps_end=1.5), "eps_end"),
        (lambda: DQNConfig(tau=0.0), "tau"),
        (lambda: DQNConfig(num_slices=0), "num_slices"),
        (lambda: DQNConfig(n_steps=0), "n_steps"),
        (lambda: DQNConfig(reward_scale=0.0), "reward_scale"),
        (lambda: DQNConfig(target_update="never"), "target_update"),
        (lambda: DQNConfig(epsilon_schedule="ladder"), r"decay or apex, received 'ladder'"),
        (lambda: DQNConfig(apex_epsilon=0.0), r"apex_epsilon must be in \(0, 1\]"),
        (lambda: DQNConfig(apex_epsilon=1.5), r"apex_epsilon=1.5"),
        (lambda: DQNConfig(apex_alpha=-1.0), r"apex_alpha >= 0.*Fix: --apex-epsilon 0.4"),
        (  # 400 frames / 8 envs = 50 steps per row < 60-step slices
            lambda: TrainConfig(algo="dqn", dqn=DQNConfig(burn_in=20, train_len=40)),
            r"longer than the 50 steps per env row",
        ),
        (lambda: TrainConfig(algo="dqn", dqn=DQNConfig(buffer_size=100)), "buffer_size"),
        (
            lambda: TrainConfig(
                algo="dqn", env=EnvConfig(num_envs=3), dqn=DQNConfig(frames_per_batch=400)
            ),
            "not a multiple of num_envs=3",
        ),
    ],
)
def test_invalid_dqn_values(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_cli_routes_shared_options_to_the_algorithm():
    cfg = parse_train("--algo", "dqn", "--frames", "4000", "--lr", "0.01", "--burn-in", "3")
    assert (cfg.dqn.frames, cfg.dqn.lr, cfg.dqn.burn_in) == (4000, 0.01, 3)
    assert cfg.ppo.frames == 50_000  # untouched
    assert cfg.to_dict()["dqn"]["frames"] == 4000
    assert parse_train("--frames", "4000").ppo.frames == 4000
    with pytest.raises(ValueError, match="--burn-in is a dqn option"):
        parse_train("--burn-in", "3")
    with pytest.raises(ValueError, match="--epochs is a ppo option"):
        parse_train("--algo", "dqn", "--epochs", "3")


def test_epsilon_greedy_and_schedule():
    q = torch.tensor([[0.0, 1.0, 0.0]]).expand(1000, 3)
    assert (EpsilonGreedy(0.0)(q) == 1).all()
    torch.manual_seed(0)
    explored = (EpsilonGreedy(0.6)(q) != 1).float().mean()  # 0.6 * 2/3 pick another action
    assert abs(float(explored) - 0.4) < 0.06
    cfg = DQNConfig(eps_start=1.0, eps_end=0.1, eps_frames=1000)
    assert [epsilon_at(cfg, f) for f in (0, 500, 1000, 5000)] == pytest.approx(
        [1.0, 0.55, 0.1, 0.1]
    )


def test_apex_epsilons_against_a_hand_computation():
    # 0.4 ** (1 + 7 i / 3) for i = 0..3: exponents 1, 10/3, 17/3, 8
    assert apex_epsilons(4) == pytest.approx([0.4, 0.047156, 0.0055591, 0.00065536], rel=1e-4)
    assert apex_epsilons(2, base=0.5, alpha=1.0) == pytest.approx([0.5, 0.25])
    assert apex_epsilons(1) == [0.4]  # a single actor: the base
    assert apex_epsilons(3, alpha=0.0) == [0.4, 0.4, 0.4]
    with pytest.raises(ValueError, match="expected n an int >= 1"):
        apex_epsilons(0)


def test_epsilon_schedule_options_and_defaults():
    cfg = parse_train("--algo", "dqn", "--epsilon-schedule", "apex", "--apex-epsilon", "0.3",
                      "--apex-alpha", "5")  # fmt: skip
    d = cfg.dqn
    assert (d.epsilon_schedule, d.apex_epsilon, d.apex_alpha) == ("apex", 0.3, 5.0)
    assert parse_train("--algo", "dqn").dqn.epsilon_schedule == "decay"  # unchanged default
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        parse_train("--algo", "dqn", "--epsilon-schedule", "ladder")


def test_apex_with_the_local_collector_gives_each_env_its_epsilon(tmp_path, capsys):
    argv = [*TINY, "--epsilon-schedule", "apex", "--run-dir", str(tmp_path / "run")]
    trainer = DQNTrainer(parse_train(*argv))
    (greedy,) = [m for m in trainer.policy.modules() if isinstance(m, EpsilonGreedy)]
    assert greedy.epsilons == pytest.approx(apex_epsilons(2))  # --num-envs 2
    assert trainer._set_epsilon() == pytest.approx(sum(apex_epsilons(2)) / 2)
    trainer.train(stop_after=64)  # collects with the per-env epsilons; they stay
    assert greedy.epsilons == pytest.approx(apex_epsilons(2))
    assert float(read_metrics(tmp_path / "run")[0]["epsilon"]) == pytest.approx((0.4 + 0.4**8) / 2)


def test_trainer_wires_burn_in_into_the_loss_and_the_sampler(tmp_path):
    """Burn-in lives in DQNLoss (episode starts exempt); every replayed slice has a step in
    the loss (min_slice_len = burn_in + 1) and slices may be cut short at episode ends."""
    cfg = parse_train(*TINY, "--n-steps", "3", "--run-dir", str(tmp_path))
    trainer = DQNTrainer(cfg)
    assert (trainer.loss.burn_in, trainer.loss.n_steps) == (4, 3)
    assert trainer.loss.burn_in_episode_starts is False
    sampler = trainer.buffer.sampler
    assert (sampler.slice_len, sampler.min_slice_len, sampler.strict_length) == (12, 5, False)
    trainer.collector.shutdown()


def test_trainer_wires_the_target_update(tmp_path):
    """The target network follows with tau 0.02 by default (0.01 before: --tau 0.01 gives
    it back), --tau reaches the soft update, and --target-update hard copies on an interval."""
    from recurrl.objectives import HardUpdate, SoftUpdate

    for extra, tau in (((), 0.02), (("--tau", "0.01"), 0.01)):
        trainer = DQNTrainer(parse_train(*TINY, *extra, "--run-dir", str(tmp_path / str(tau))))
        assert isinstance(trainer.updater, SoftUpdate) and trainer.updater.tau == tau
        trainer.collector.shutdown()
    hard = parse_train(*TINY, "--target-update", "hard", "--hard-update-interval", "7",
                       "--run-dir", str(tmp_path / "hard"))  # fmt: skip
    trainer = DQNTrainer(hard)
    assert isinstance(trainer.updater, HardUpdate)
    assert trainer.updater.value_network_update_interval == 7
    trainer.collector.shutdown()


def test_observation_norm_is_fitted_on_the_warm_up_frames(tmp_path):
    cfg = parse_train(*TINY, "--run-dir", str(tmp_path))
    trainer = DQNTrainer(cfg)
    norm = trainer.model.obs_norm
    assert (norm.loc == 0).all() and (norm.scale == 1).all()  # identity before learning
    trainer.train(stop_after=64)
    assert (norm.loc == 0).all() and not trainer.normalized
    trainer = DQNTrainer(cfg, resume=True)
    trainer.train(stop_after=128)  # learning starts at 128 frames: fitted, then frozen
    obs = trainer.buffer.storage.data["observation"][:128]
    torch.testing.assert_close(trainer.model.obs_norm.loc, obs.mean(0))
    torch.testing.assert_close(trainer.model.obs_norm.scale, obs.std(0))
    target = trainer.loss.target_value_network
    assert torch.equal(target[0].module.loc, trainer.model.obs_norm.loc)  # target too
    no_norm = DQNTrainer(parse_train(*TINY, "--no-obs-norm", "--run-dir", str(tmp_path / "b")))
    no_norm.train()
    assert (no_norm.model.obs_norm.loc == 0).all()


@pytest.mark.parametrize("memory", ["lstm", "gru", "mingru", "lru", "none"])
def test_q_network_writes_action_values_and_integer_actions(memory):
    from recurrl.trainers.config import ModelConfig

    net = QNetwork(ModelConfig(memory=memory, hidden_size=8), obs_dim=2, n_actions=3)
    td = TensorDict({"observation": torch.randn(5, 2), "is_init": torch.ones(5, 1).bool()}, [5])
    out = net.policy(0.0)(td)
    assert out["action_value"].shape == (5, 3)
    assert out["action"].dtype == torch.long and out["action"].shape == (5,)
    assert (out["action"] == out["action_value"].argmax(-1)).all()


def test_tiny_dqn_run_writes_the_run_and_evaluates(tmp_path, capsys):
    run_dir = tmp_path / "run"
    lines = run_cli(capsys, "train", *TINY, "--run-dir", str(run_dir), "--checkpoint-every", "128")
    assert lines[-1] == str(run_dir)
    assert {"config.json", "metrics.csv", "checkpoint.pt"} <= {p.name for p in run_dir.iterdir()}
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["algo"] == "dqn" and saved["dqn"]["frames"] == 256
    assert load_config(run_dir).dqn.burn_in == 4
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [64, 128, 192, 256]
    assert rows[0]["loss"] == "" and float(rows[1]["loss"]) >= 0  # updates from 128 frames
    assert {"episode_return", "epsilon", "td_error", "fps"} <= set(rows[0])
    lines = run_cli(capsys, "eval", str(run_dir), "--episodes", "3")
    assert re.fullmatch(r"mean_return: \d+\.\d\d ± \d+\.\d\d over 3 episodes", lines[-1])
    assert run_cli(capsys, "eval", str(run_dir), "--episodes", "3")[-1] == lines[-1]


def test_same_seed_same_numbers(tmp_path, capsys):
    run_cli(capsys, "train", *TINY, "--run-dir", str(tmp_path / "a"))
    run_cli(capsys, "train", *TINY, "--run-dir", str(tmp_path / "b"))
    run_cli(capsys, "train", *TINY, "--run-dir", str(tmp_path / "c"), "--seed", "1")
    a, b, c = (metric_numbers(tmp_path / n) for n in "abc")
    assert a == b
    assert a != c


@pytest.mark.parametrize("extra", [[], ["--memory", "gru", "--target-update", "hard",
                                        "--hard-update-interval", "3"]])  # fmt: skip
def test_resume_replays_the_uninterrupted_run(tmp_path, capsys, extra):
    argv = [*TINY, "--checkpoint-every", "128", *extra]
    # the checkpoint at 128 frames holds the replay buffer too
    check_resume_replays(capsys, tmp_path, argv, DQNTrainer, stop_after=128)
    # a DQN run cannot be resumed as PPO
    assert main(["train", "--resume", str(tmp_path / "cut"), "--algo", "ppo"]) == 2
    assert "the run has --algo dqn, received --algo ppo" in capsys.readouterr().err


def test_a_stop_request_saves_the_batch_and_resume_replays_the_uninterrupted_run(tmp_path, capsys):
    argv = [*TINY, "--checkpoint-every", "100000"]  # the only checkpoint: the stop's, at 128
    check_resume_replays(capsys, tmp_path, argv, DQNTrainer, stop=StopAfterBatches(2))


def test_q_network_lives_with_the_models_and_stays_importable_from_dqn():
    import ast
    import inspect

    from recurrl.trainers import dqn, evaluate, loop, models, ppo

    for name in ("QNetwork", "EpsilonGreedy", "ObservationNorm"):
        assert getattr(dqn, name) is getattr(models, name) and name in dqn.__all__
    # the recipes share setup through loop.py / collection.py / models.py, not through each
    # other, and the loop they share imports neither
    pairs = ((dqn, {"ppo"}), (evaluate, {"dqn", "ppo"}), (ppo, {"dqn"}), (loop, {"dqn", "ppo"}))
    for module, siblings in pairs:
        imported = {
            node.module
            for node in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not {f"recurrl.trainers.{s}" for s in siblings} & imported, module.__name__


def test_anneal_lr_decays_linearly_with_the_frames_done_and_is_off_by_default(tmp_path):
    cfg = parse_train(*TINY, "--run-dir", str(tmp_path / "off"))
    assert cfg.dqn.anneal_lr is False
    trainer = DQNTrainer(cfg)
    trainer.train()
    assert trainer.optimizer.param_groups[0]["lr"] == cfg.dqn.lr
    cfg = parse_train(*TINY, "--anneal-lr", "--run-dir", str(tmp_path / "on"))
    trainer = DQNTrainer(cfg)
    seen = []
    update = trainer.update

    def spy():
        out = update()
        seen.append((trainer.collector.frames, trainer.optimizer.param_groups[0]["lr"]))
        return out

    trainer.update = spy
    trainer.train()
    # before each batch's updates, from the frames collected before that batch
    lr = cfg.dqn.lr
    expected = [(f, lr * (1 - (f - 64) / 256)) for f in (128, 192, 256)]
    assert seen == [(f, pytest.approx(v)) for f, v in expected]


@pytest.mark.parametrize(
    "argv",
    [[], ["--sampler", "tape", "--burn-in", "0"], ["--prioritized", "--priority-alpha", "0"]],
)
def test_replay_seed_gives_every_sampler_its_own_generator(argv, tmp_path):
    trainer = DQNTrainer(parse_train(*TINY, *argv, "--replay-seed", "7",
                                     "--run-dir", str(tmp_path)))  # fmt: skip
    assert trainer.buffer.sampler.generator.initial_seed() == 7
    trainer.collector.shutdown()
    trainer = DQNTrainer(parse_train(*TINY, *argv, "--run-dir", str(tmp_path / "b")))
    assert trainer.buffer.sampler.generator is None  # default: torch's global stream
    trainer.collector.shutdown()


def _global_stream_after_training(tmp_path, *argv: str) -> torch.Tensor:
    trainer = DQNTrainer(parse_train(*TINY, *argv, "--run-dir", str(tmp_path)))
    trainer.train()  # 256 frames: updates from 128 on
    return torch.get_rng_state()


def test_with_a_replay_seed_runs_that_differ_in_their_draws_share_the_global_stream(tmp_path):
    """Uniform slices (``randint``) and prioritized ones (``rand``) take different amounts of
    the global stream; with ``--replay-seed`` neither takes any, so the two runs' init and
    exploration noise stay the same (a paired comparison)."""
    prio = ["--prioritized", "--priority-alpha", "0"]
    shared = [_global_stream_after_training(tmp_path / name, *extra, "--replay-seed", "3")
              for name, extra in (("u", []), ("p", prio))]  # fmt: skip
    assert torch.equal(shared[0], shared[1])
    apart = [_global_stream_after_training(tmp_path / name, *extra)
             for name, extra in (("u0", []), ("p0", prio))]  # fmt: skip
    assert not torch.equal(apart[0], apart[1])  # without it the draws move the stream


def test_resume_replays_the_uninterrupted_run_with_a_replay_seed(tmp_path, capsys):
    argv = [*TINY, "--replay-seed", "5", "--checkpoint-every", "128"]
    check_resume_replays(capsys, tmp_path, argv, DQNTrainer, stop_after=128)
