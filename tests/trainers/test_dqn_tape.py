"""`recurrl train --algo dqn --sampler tape`: options, refused contradictions, tapes in the
updates, no bootstrap across an episode start inside a tape, resume, Ray."""

from __future__ import annotations

import itertools

import pytest
import torch

from recurrl.data import PrioritizedTapeSampler, SliceSampler, TapeSampler
from recurrl.objectives import DQNLoss
from recurrl.trainers import DQNConfig, DQNTrainer
from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.cli import main
from recurrl.trainers.logger import read_metrics

from ._helpers import check_resume_replays, parse_train, run_cli
from .test_dqn import TINY

_SLICE_ONLY = {"--num-slices", "--burn-in", "--train-len"}
# TINY's run (2 envs x 32 steps per batch, 4 batches, updates from the second batch) on 2
# tapes of 32 steps instead of its slices
TAPE = [
    *(a for flag, a in zip(["", *TINY[:-1]], TINY, strict=True)
      if a not in _SLICE_ONLY and flag not in _SLICE_ONLY),
    "--sampler", "tape", "--tape-frames", "32", "--num-tapes", "2",
    "--engine", "gymnasium",  # a stream whose tapes hold episode ends in every row
]  # fmt: skip
MASK = ("collector", "mask")


def test_options_reach_the_sampler_and_the_loss_and_tapes_are_the_default(tmp_path):
    plain = parse_train("--algo", "dqn")
    assert (plain.dqn.sampler, plain.dqn.burn_in) == ("tape", 0)
    assert type(DQNTrainer(parse_train(
        "--algo", "dqn", "--hidden-size", "8", "--run-dir", str(tmp_path / "s"))
    ).buffer.sampler) is TapeSampler  # fmt: skip
    d = DQNConfig(sampler="tape")
    assert (d.burn_in, d.tape_frames, d.num_tapes, d.tape_weight) == (0, 960, 2, "uniform")
    assert d.batch_steps == 1920 == DQNConfig(sampler="slice").batch_steps  # 64 x 30 slices
    assert DQNConfig() == d  # auto is resolved at construction


@pytest.mark.parametrize(
    "argv",
    [["--prioritized", "--sampler", "slice"], ["--burn-in", "4"], ["--burn-in-stop-gradient"],
     ["--slice-start", "stride"], ["--sampler", "slice"]],
)  # fmt: skip
def test_auto_takes_slices_when_a_slice_option_is_given(argv, tmp_path):
    cfg = parse_train("--algo", "dqn", *argv)
    assert cfg.dqn.sampler == "slice"
    assert cfg.dqn.burn_in == (4 if "4" in argv else 10)  # slices keep their burn-in default
    cfg = parse_train("--algo", "dqn", "--hidden-size", "8", "--run-dir", str(tmp_path), *argv)
    assert isinstance(DQNTrainer(cfg).buffer.sampler, SliceSampler)


def test_runs_saved_before_the_auto_sampler_resume_with_slices(tmp_path):
    from recurrl.trainers.config import TrainConfig

    old = TrainConfig.from_dict({"algo": "dqn", "dqn": {"burn_in": 10}}).to_dict()
    del old["dqn"]["sampler"]  # a config.json written before the option existed
    assert TrainConfig.from_dict(old, saved=True).dqn.sampler == "slice"

    cfg = parse_train(*TAPE, "--tape-weight", "length", "--run-dir", str(tmp_path / "t"))
    d = cfg.dqn
    assert (d.sampler, d.burn_in, d.tape_frames, d.num_tapes) == ("tape", 0, 32, 2)
    trainer = DQNTrainer(cfg)
    sampler = trainer.buffer.sampler
    assert isinstance(sampler, TapeSampler) and sampler.weight == "length"
    assert sampler.tape_shape(trainer.buffer.batch_size) == (2, 32)
    assert trainer.loss.burn_in == 0
    assert parse_train(*TAPE, "--burn-in", "0").dqn.burn_in == 0  # no burn-in: fine


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--burn-in", "4"], "--burn-in"),
        (["--burn-in-stop-gradient"], "--burn-in-stop-gradient"),
        (["--slice-start", "stride"], "--slice-start"),
    ],
)
def test_slice_only_options_are_refused_with_the_fix(argv, flag, capsys):
    match = rf"sampler=tape expects no burn-in.*received {flag}.*Fix: drop {flag}"
    with pytest.raises(ValueError, match=match):
        parse_train(*TAPE, *argv)
    assert main(["train", *TAPE, *argv]) == 2  # a usage error: one line, nothing written
    assert "Fix: drop" in capsys.readouterr().err


def test_prioritized_alone_draws_the_tapes_episodes_by_priority(tmp_path, capsys):
    cfg = parse_train("--algo", "dqn", "--prioritized")
    assert (cfg.dqn.sampler, cfg.dqn.burn_in) == ("tape", 0)  # not a slice-only option
    cfg = parse_train(*TAPE, "--prioritized", "--priority-alpha", "0.7", "--priority-eta",
                      "0.5", "--run-dir", str(tmp_path))  # fmt: skip
    trainer = DQNTrainer(cfg)
    sampler = trainer.buffer.sampler
    assert isinstance(sampler, PrioritizedTapeSampler)
    assert (sampler.alpha, sampler.beta, sampler.eta) == (0.7, 1.0, 0.5)  # beta: annealed
    assert sampler.tape_shape(trainer.buffer.batch_size) == (2, 32)
    with pytest.raises(ValueError, match=r"prioritized tapes draw episodes by priority.*Fix"):
        parse_train(*TAPE, "--prioritized", "--tape-weight", "length")
    assert main(["train", *TAPE, "--prioritized", "--tape-weight", "length"]) == 2
    assert "--tape-weight" in capsys.readouterr().err


def test_prioritized_tapes_set_each_episodes_priority_from_its_td_errors(tmp_path):
    """After an update every episode on the tape gets the eta mix of its own steps' |TD
    errors| (at the storage position of its first step); weights reach the loss."""
    cfg = parse_train(*TAPE, "--prioritized", "--priority-eta", "0.5", "--run-dir",
                      str(tmp_path))  # fmt: skip
    trainer = DQNTrainer(cfg)
    trainer.train(stop_after=128)  # data in the buffer, one round of updates
    sampler = trainer.buffer.sampler
    held = sampler._priority[: len(trainer.buffer)]
    assert (held != 1.0).any()  # updated by the trainer
    sample = trainer.buffer.sample()
    assert "_weight" in sample and float(sample["_weight"].max()) <= 1.0
    trainer.loss(sample)
    trainer.update_priorities(sample)
    keep = trainer.loss.loss_mask(sample)
    index, is_init = sample["index"], sample["is_init"].reshape(-1)
    starts = [*torch.nonzero(is_init).squeeze(-1).tolist(), len(index)]
    expect: dict[int, list[torch.Tensor]] = {}  # an episode drawn twice: mean of both
    for a, b in itertools.pairwise(starts):
        err = sample["td_error"].reshape(-1)[a:b][keep.reshape(-1)[a:b]].abs().double()
        if len(err):
            expect.setdefault(int(index[a]), []).append(0.5 * err.max() + 0.5 * err.mean())
    for start, values in expect.items():
        got = sampler._priority[start].double()
        want = torch.stack(values).mean() + sampler.eps
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=0)
    checked = len(expect)
    assert checked >= 1


def test_resume_replays_the_uninterrupted_prioritized_tape_run(tmp_path, capsys):
    argv = [*TAPE, "--prioritized", "--checkpoint-every", "128"]
    check_resume_replays(capsys, tmp_path, argv, DQNTrainer, stop_after=128)


def test_bad_tape_values_are_refused():
    with pytest.raises(SystemExit):
        parse_train(*TAPE, "--sampler", "episodes")
    with pytest.raises(SystemExit):
        parse_train(*TAPE, "--tape-weight", "priority")
    with pytest.raises(ValueError, match="tape_frames must be an int >= 1, received 0"):
        parse_train(*TAPE, "--tape-frames", "0")
    with pytest.raises(ValueError, match="sampler must be auto, slice or tape, received 'ring'"):
        DQNConfig(sampler="ring")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tape_weight must be uniform or length"):
        DQNConfig(tape_weight="td")  # type: ignore[arg-type]


def test_tiny_tape_run_trains_on_tapes(tmp_path, capsys, monkeypatch):
    seen = []
    forward = DQNLoss.forward

    def record(self, td):
        seen.append(td.clone())
        return forward(self, td)

    monkeypatch.setattr(DQNLoss, "forward", record)
    run_dir = tmp_path / "run"
    lines = run_cli(capsys, "train", *TAPE, "--run-dir", str(run_dir))
    assert lines[-1] == str(run_dir)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [64, 128, 192, 256]
    assert len(seen) == 3 * 2  # updates from 128 frames on, 2 per batch
    for batch in seen:
        assert batch.batch_size == torch.Size([64])
        rows = batch.view(2, 32)
        is_init = rows["is_init"].squeeze(-1)
        assert is_init[:, 0].all(), "every tape starts an episode"
        assert is_init[:, 1:].any(), "episodes end to end: is_init inside a row"
        assert (rows["step_count"].squeeze(-1)[rows[MASK] & is_init] == 0).all()
        done = rows["next", "done"].squeeze(-1)
        before = is_init[:, 1:] & rows[MASK][:, 1:]  # the step before an episode start
        assert done[:, :-1][before].all(), "every episode in a tape ends with done"


def _episodes(tape) -> list[torch.Tensor]:
    """Positions of the real steps of each episode of a flat tape (split at ``is_init``)."""
    starts = torch.nonzero(tape["is_init"].reshape(-1) & tape[MASK]).reshape(-1).tolist()
    ends = [*starts[1:], int(tape[MASK].sum())]
    return [torch.arange(a, b) for a, b in zip(starts, ends, strict=True) if b > a]


def test_the_loss_never_bootstraps_across_an_episode_start_inside_a_tape(tmp_path):
    """Inside a tape only ``is_init`` separates two episodes once the end flags are cleared:
    an episode's TD errors must equal those of the episode alone, and not move when every
    other episode's observations and rewards change. Bootstrapping from the next position
    (the next episode's first step) or summing its rewards in the n-step target fails."""
    cfg = parse_train(*TAPE, "--frames", "128", "--run-dir", str(tmp_path / "run"))
    trainer = DQNTrainer(cfg)
    trainer.train()
    torch.manual_seed(0)
    tape = trainer.buffer.sample()[:32]  # the first tape
    for key in (("next", "done"), ("next", "terminated"), ("next", "truncated")):
        tape[key] = torch.zeros_like(tape[key])
    episodes = _episodes(tape)
    assert len(episodes) >= 2
    loss = trainer.loss  # n_steps=5, double DQN, target network
    with torch.no_grad():
        base = tape.clone()
        loss(base)
        for k, ep in enumerate(episodes[:-1]):
            alone = tape[ep].clone()
            loss(alone)
            torch.testing.assert_close(base["td_error"][ep], alone["td_error"])
            other = tape.clone()
            rest = torch.ones(32, dtype=torch.bool)
            rest[ep] = False
            for key in ("observation", ("next", "observation"), ("next", "reward")):
                value = other[key]
                value[rest] = value[rest] * 3.0 + 1.0
                other[key] = value
            loss(other)
            torch.testing.assert_close(other["td_error"][ep], base["td_error"][ep])
            assert not torch.equal(other["td_error"][rest], base["td_error"][rest]), k


def test_resume_replays_the_uninterrupted_tape_run(tmp_path, capsys):
    # the checkpoint at 128 frames holds the tape sampler's episode bookkeeping and generator
    check_resume_replays(capsys, tmp_path, TAPE, DQNTrainer, stop_after=128)
    assert main(["train", "--resume", str(tmp_path / "cut"), "--sampler", "slice"]) == 2
    assert "sampler" in capsys.readouterr().err


@pytest.mark.parametrize("prioritized", [False, True])
def test_ray_workers_write_what_the_tapes_replay(ray_session, tmp_path, capsys, prioritized):
    run_dir = tmp_path / "run"
    ray = ["--collector", "ray", "--workers", "2"]
    prio = ["--prioritized"] if prioritized else []
    run_cli(capsys, "train", *TAPE, *ray, *prio, "--run-dir", str(run_dir))
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [64, 128, 192, 256]
    assert all(float(r["loss"]) == float(r["loss"]) for r in rows[1:])  # updates ran
    if prioritized:  # the priorities were set in the buffer's actor, and saved with it
        held = ckpt.load(run_dir)["extra"]["buffer"]["sampler"]["priority"][:256]
        assert (held != 1.0).any() and torch.isfinite(held).all()
