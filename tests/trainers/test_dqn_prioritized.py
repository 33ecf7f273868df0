"""`recurrl train --algo dqn --prioritized` / `--value-rescale` / `--slice-start`: options,
config files old and new, the priority update after every gradient step, resume, Ray."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from recurrl.data import PrioritizedSliceSampler, SliceSampler
from recurrl.trainers import DQNConfig, DQNTrainer, TrainConfig, load_config
from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.cli import main
from recurrl.trainers.dqn import priority_beta_at
from recurrl.trainers.logger import read_metrics

from ._helpers import check_resume_replays, parse_train, run_cli
from .test_dqn import TINY

PRIO = ["--prioritized", "--priority-alpha", "0.9", "--priority-beta", "0.5",
        "--priority-eta", "0.8", "--value-rescale", "--slice-start", "stride",
        "--burn-in-stop-gradient"]  # fmt: skip


def test_options_reach_the_sampler_and_the_loss_and_defaults_stay_uniform(tmp_path):
    cfg = parse_train(*TINY, "--run-dir", str(tmp_path / "plain"))
    d = cfg.dqn
    assert (d.prioritized, d.value_rescale, d.slice_start) == (False, False, "any")
    assert (d.priority_alpha, d.priority_beta, d.priority_eta) == (0.6, 0.4, 0.9)
    trainer = DQNTrainer(cfg)
    sampler = trainer.buffer.sampler
    assert type(sampler) is SliceSampler and sampler.start == "any"
    assert trainer.loss.value_rescale is False and trainer.loss.burn_in_stop_gradient is False

    cfg = parse_train(*TINY, *PRIO, "--run-dir", str(tmp_path / "prio"))
    d = cfg.dqn
    assert (d.prioritized, d.value_rescale, d.slice_start) == (True, True, "stride")
    assert (d.priority_alpha, d.priority_beta, d.priority_eta) == (0.9, 0.5, 0.8)
    trainer = DQNTrainer(cfg)
    sampler = trainer.buffer.sampler
    assert isinstance(sampler, PrioritizedSliceSampler)
    assert (sampler.alpha, sampler.beta, sampler.eta) == (0.9, 1.0, 0.8)  # beta: see dqn.py
    assert (sampler.start, sampler.min_slice_len, sampler.max_capacity) == ("stride", 5, 50_000)
    assert trainer.loss.value_rescale is True and trainer.loss.burn_in_stop_gradient is True


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--priority-beta", "1.5"], r"priority_beta must be in \[0, 1\], received 1.5"),
        (["--priority-eta", "-0.1"], r"priority_eta must be in \[0, 1\]"),
        (["--priority-alpha", "-1"], r"priority_alpha must be >= 0"),
    ],
)
def test_bad_values_are_refused_when_parsed(argv, match):
    with pytest.raises(ValueError, match=match):
        parse_train(*TINY, *argv)
    with pytest.raises(ValueError, match="--prioritized is a dqn option"):
        parse_train("--prioritized")


def test_a_bad_slice_start_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        parse_train(*TINY, "--slice-start", "middle")
    assert "invalid choice: 'middle'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="slice_start must be any, trajectory or stride"):
        DQNConfig(slice_start="middle")  # type: ignore[arg-type]


def test_config_round_trips_and_old_files_load_with_uniform_replay(tmp_path, capsys):
    cfg = parse_train(*TINY, *PRIO)
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *TINY, *PRIO, "--run-dir", str(run_dir))
    assert load_config(run_dir) == TrainConfig.from_dict({**cfg.to_dict(), "run": {
        **cfg.to_dict()["run"], "run_dir": str(run_dir)}})  # fmt: skip
    # a config.json written before these options existed: the old (uniform) replay
    path = run_dir / "config.json"
    data = json.loads(path.read_text())
    new = ("prioritized", "priority_alpha", "priority_beta", "priority_eta", "value_rescale",
           "slice_start", "burn_in_stop_gradient", "priority_uniform_mix")  # fmt: skip
    for name in new:
        del data["dqn"][name]
    path.write_text(json.dumps(data))
    old = load_config(run_dir).dqn
    assert (old.prioritized, old.value_rescale, old.slice_start) == (False, False, "any")
    assert old.burn_in_stop_gradient is False


def _train_seeing_weights(cfg):
    """Train; return the samples drawn and ``(frames, weights)`` as the loss saw them."""
    trainer = DQNTrainer(cfg)
    drawn, seen = [], []
    sample, forward = trainer.buffer.sample, trainer.loss.forward

    def sample_spy(*args, **kwargs):
        drawn.append(sample(*args, **kwargs))
        return drawn[-1].clone()

    def forward_spy(td):
        seen.append((trainer.collector.frames, td["_weight"].clone()))
        return forward(td)

    trainer.buffer.sample, trainer.loss.forward = sample_spy, forward_spy
    trainer.train()
    return drawn, seen


def test_beta_anneals_linearly_to_one_and_weights_are_raised_to_it(tmp_path):
    d = DQNConfig(frames=1000, frames_per_batch=100, priority_beta=0.4)
    assert [priority_beta_at(d, f) for f in (-100, 0, 500, 1000, 2000)] == pytest.approx(
        [0.4, 0.4, 0.7, 1.0, 1.0]
    )
    cfg = parse_train(*TINY, "--prioritized", "--run-dir", str(tmp_path))
    drawn, seen = _train_seeing_weights(cfg)
    assert [f for f, _ in seen] == [f for f in (128, 192, 256) for _ in range(2)]
    for (frames, weight), raw in zip(seen, drawn[-len(seen) :], strict=True):
        beta = priority_beta_at(cfg.dqn, frames - cfg.dqn.frames_per_batch)
        assert 0.4 <= beta < 1
        torch.testing.assert_close(weight, raw["_weight"].pow(beta))
        assert float(weight.min()) > 0 and float(weight.max()) <= 1.0


def test_batch_weight_norm_keeps_each_samples_largest_weight_at_one(tmp_path):
    """``--priority-weight-norm batch``: the weights of each sample divided by its largest
    (after the power beta), so one stale sequence of tiny priority cannot shrink every
    update; ``global`` keeps the sampler's normalisation."""
    cfg = parse_train(*TINY, "--prioritized", "--priority-weight-norm", "batch",
                      "--run-dir", str(tmp_path))  # fmt: skip
    assert cfg.dqn.priority_weight_norm == "batch"
    drawn, seen = _train_seeing_weights(cfg)
    assert seen
    for (frames, weight), raw in zip(seen, drawn[-len(seen) :], strict=True):
        beta = priority_beta_at(cfg.dqn, frames - cfg.dqn.frames_per_batch)
        want = raw["_weight"].pow(beta)
        torch.testing.assert_close(weight, want / want.max())
        assert float(weight.max()) == 1.0
    with pytest.raises(ValueError, match="priority_weight_norm must be global or batch"):
        DQNConfig(priority_weight_norm="mean")


@pytest.mark.parametrize("sampler", ["tape", "slice"])
def test_uniform_mix_reaches_either_sampler_and_needs_prioritized(sampler, tmp_path):
    burn_in = ["--burn-in", "0"] if sampler == "tape" else []  # a slice-only option
    cfg = parse_train(*TINY, *burn_in, "--sampler", sampler, "--prioritized",
                      "--priority-uniform-mix", "0.25", "--run-dir", str(tmp_path))  # fmt: skip
    assert cfg.dqn.priority_uniform_mix == 0.25
    assert DQNTrainer(cfg).buffer.sampler.uniform_mix == 0.25
    with pytest.raises(ValueError, match=r"prioritized is off.*add --prioritized"):
        parse_train(*TINY, "--priority-uniform-mix", "0.25")
    with pytest.raises(ValueError, match=r"priority_uniform_mix must be in \[0, 1\]"):
        DQNConfig(prioritized=True, priority_uniform_mix=2.0)


def test_priorities_are_updated_from_the_trained_steps_after_every_update(tmp_path):
    cfg = parse_train(*TINY, "--prioritized", "--run-dir", str(tmp_path))
    trainer = DQNTrainer(cfg)
    calls = []
    update = trainer.buffer.update_priority

    def spy(index, priority):
        calls.append((index.clone(), priority.clone()))
        return update(index, priority)

    trainer.buffer.update_priority = spy
    trainer.train()
    assert len(calls) == 3 * cfg.dqn.updates_per_batch  # batches at 128, 192 and 256 frames
    for index, priority in calls:
        assert index.dim() == 1 and len(index) == len(priority) <= cfg.dqn.num_slices
        assert torch.isfinite(priority).all()
    sampler = trainer.buffer.sampler
    held = sampler._priority[: len(trainer.buffer)]
    # updated starts no longer hold the initial priority 1, and they differ between slices
    assert (held != 1.0).any() and len(set(held.tolist())) > 2
    rows = read_metrics(tmp_path)
    assert all(math.isfinite(float(r["loss"])) for r in rows[1:])


def test_a_slices_priority_ignores_its_burn_in_steps(tmp_path):
    """The priority written equals the eta mix of the slice's trained steps, whatever the TD
    errors written at its burn-in steps (here: made huge)."""
    cfg = parse_train(*TINY, "--prioritized", "--priority-eta", "0.5", "--run-dir", str(tmp_path))
    trainer = DQNTrainer(cfg)
    trainer.train(stop_after=128)  # data in the buffer, one round of updates
    sample = trainer.buffer.sample()
    trainer.loss(sample)
    keep = trainer.loss.loss_mask(sample)
    assert (~keep).any() and (sample["td_error"][~keep] == 0).all()
    sample["td_error"] = sample["td_error"].masked_fill(~keep, 1e6)
    trainer.update_priorities(sample)
    index, is_init = sample["index"], sample["is_init"].squeeze(-1)
    starts = [*torch.nonzero(is_init).squeeze(-1).tolist(), len(index)]
    for a, b in itertools.pairwise(starts):
        err = sample["td_error"][a:b][keep[a:b]].abs().double()
        if len(err):
            expect = 0.5 * err.max() + 0.5 * err.mean() + trainer.buffer.sampler.eps
            got = trainer.buffer.sampler._priority[index[a]].double()
            # several slices may share a start (mean of their values): check the unique ones
            if int((index[starts[:-1]] == index[a]).sum()) == 1:
                torch.testing.assert_close(got, expect.to(got.dtype), rtol=1e-5, atol=0)


def test_resume_replays_the_uninterrupted_prioritized_run(tmp_path, capsys):
    argv = [*TINY, *PRIO, "--checkpoint-every", "128"]
    # the checkpoint at 128 frames holds the sampler's priorities after the first updates
    check_resume_replays(capsys, tmp_path, argv, DQNTrainer, stop_after=128)
    assert main(["train", "--resume", str(tmp_path / "cut"), "--no-prioritized"]) == 2
    assert "prioritized" in capsys.readouterr().err


def test_ray_workers_and_remote_priorities(ray_session, tmp_path, capsys):
    run_dir = tmp_path / "run"
    ray = ["--collector", "ray", "--workers", "2"]
    run_cli(capsys, "train", *TINY, "--prioritized", *ray, "--run-dir", str(run_dir))
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [64, 128, 192, 256]
    priority = ckpt.load(run_dir)["extra"]["buffer"]["sampler"]["priority"]
    held = priority[:256]
    assert (held != 1.0).any() and torch.isfinite(held).all()


def test_prioritized_mixes_half_uniform_unless_told(tmp_path):
    """``--prioritized`` draws with half of the probability uniform by default (the setting
    measured for both cells); ``--priority-uniform-mix 0`` draws by priority alone; without
    ``--prioritized`` nothing is mixed; a saved run from before the option ran without."""
    from recurrl.trainers.config import TrainConfig

    assert parse_train(*TINY).dqn.priority_uniform_mix == 0.0
    cfg = parse_train(*TINY, "--prioritized", "--run-dir", str(tmp_path / "mixed"))
    assert cfg.dqn.priority_uniform_mix == 0.5
    assert DQNTrainer(cfg).buffer.sampler.uniform_mix == 0.5
    alone = parse_train(*TINY, "--prioritized", "--priority-uniform-mix", "0",
                        "--run-dir", str(tmp_path / "alone"))  # fmt: skip
    assert DQNTrainer(alone).buffer.sampler.uniform_mix == 0.0
    old = cfg.to_dict()
    del old["dqn"]["priority_uniform_mix"]
    assert TrainConfig.from_dict(old, saved=True).dqn.priority_uniform_mix == 0.0
    assert TrainConfig.from_dict(old).dqn.priority_uniform_mix == 0.5
