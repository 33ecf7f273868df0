"""The `recurrl` command: parsing, --help, errors, and tiny train / resume / eval runs."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from recurrl.trainers import PPOTrainer, load_config
from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.cli import main
from recurrl.trainers.logger import read_metrics

from ._helpers import (
    StopAfterBatches,
    check_resume_replays,
    metric_numbers,
    parse_train,
    run_cli,
)

# 2 envs x 64 steps per batch, 2 batches: about a second per run
TINY = [
    "--num-envs", "2", "--frames", "256", "--frames-per-batch", "128",
    "--num-minibatches", "2", "--epochs", "2", "--hidden-size", "8", "--quiet",
    "--eval-episodes", "0", "--no-tensorboard",
]  # fmt: skip


def test_defaults_are_ppo_lstm_on_masked_cartpole():
    cfg = parse_train()
    assert (cfg.algo, cfg.model.memory, cfg.env.env) == ("ppo", "lstm", "CartPole-masked")
    assert cfg.run.run_dir is None


def test_options_map_to_fields():
    cfg = parse_train(
        "--memory", "gru", "--hidden-size", "16", "--layers", "2", "--seed", "5",
        "--num-envs", "4", "--frames", "4000", "--no-anneal-lr", "--max-episode-steps", "50",
    )  # fmt: skip
    assert (cfg.model.memory, cfg.model.hidden_size, cfg.model.num_layers) == ("gru", 16, 2)
    assert (cfg.run.seed, cfg.env.num_envs, cfg.ppo.frames) == (5, 4, 4000)
    assert cfg.ppo.anneal_lr is False and cfg.env.max_episode_steps == 50


def test_optional_schedule_ends_accept_none():
    cfg = parse_train("--clip-epsilon-end", "none", "--entropy-coef-end", "0.002")
    assert cfg.ppo.clip_epsilon_end is None and cfg.ppo.entropy_coef_end == 0.002
    assert parse_train("--clip-epsilon-end", "0.1").ppo.clip_epsilon_end == 0.1


def test_help_shows_field_docstrings(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    from recurrl.modules.registry import memory_names

    assert f"--memory {{{','.join([*memory_names(), 'none'])}}}" in out  # the registry's list
    assert "a feed-forward MLP baseline without memory" in out
    assert "--resume RUN_DIR" in out


def test_bad_choice_and_bad_config_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--memory", "tcn"])
    assert info.value.code == 2
    capsys.readouterr()
    # the config's own check, a usage error (an explicit batch: frames must fit it)
    assert main(["train", "--frames", "1500", "--frames-per-batch", "1000"]) == 2
    assert "Fix: --frames 2000" in capsys.readouterr().err


def test_frames_are_rounded_up_to_whole_batches_and_the_run_says_so(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = [a for a in TINY if a not in ("--frames-per-batch", "128")]  # batch: 2 envs x 50
    argv[argv.index("--frames") + 1] = "150"
    assert main(["train", *argv, "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr()
    assert out.out.strip().splitlines()[-1] == str(run_dir)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [100, 200]
    assert "--frames 150 rounded up to 200, a whole number of 100-frame batches (2 envs x 50" in (
        out.err
    )


def test_tiny_train_writes_the_run_and_prints_its_dir_last(tmp_path, capsys):
    run_dir = tmp_path / "run"
    lines = run_cli(capsys, "train", *TINY, "--run-dir", str(run_dir), "--checkpoint-every", "128")
    assert lines[-1] == str(run_dir)
    assert {"config.json", "metrics.csv", "checkpoint.pt"} <= {p.name for p in run_dir.iterdir()}
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["run"]["run_dir"] == str(run_dir) and saved["ppo"]["frames"] == 256
    assert load_config(run_dir).env.num_envs == 2
    rows = read_metrics(run_dir)
    assert [int(r["frames"]) for r in rows] == [128, 256]
    assert {"episode_return", "loss_objective", "entropy", "fps"} <= set(rows[0])
    # a second train into the same directory must not overwrite it
    assert main(["train", *TINY, "--run-dir", str(run_dir)]) == 2
    assert "already holds a run. Fix: --resume" in capsys.readouterr().err


def test_same_seed_same_numbers(tmp_path, capsys):
    run_cli(capsys, "train", *TINY, "--run-dir", str(tmp_path / "a"))
    run_cli(capsys, "train", *TINY, "--run-dir", str(tmp_path / "b"))
    run_cli(capsys, "train", *TINY, "--run-dir", str(tmp_path / "c"), "--seed", "1")
    a, b, c = (metric_numbers(tmp_path / n) for n in "abc")
    assert a == b
    assert a != c


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--memory", "gru", "--slice-len", "16", "--num-minibatches", "4"],
        ["--memory", "none"],
        ["--shared-trunk"],
        ["--clip-epsilon-end", "0.05"],  # the clip range schedule resumes where it was
    ],
)
def test_resume_replays_the_uninterrupted_run(tmp_path, capsys, extra):
    argv = [*TINY, "--frames", "512", "--checkpoint-every", "256", *extra]
    check_resume_replays(capsys, tmp_path, argv, PPOTrainer, stop_after=256)


def test_a_stop_request_saves_the_batch_and_resume_replays_the_uninterrupted_run(tmp_path, capsys):
    # no periodic checkpoint: the one at 256 frames is the stop's (what Ctrl-C does)
    argv = [*TINY, "--frames", "512", "--checkpoint-every", "100000"]
    check_resume_replays(capsys, tmp_path, argv, PPOTrainer, stop=StopAfterBatches(2))


def test_resume_with_more_frames_continues(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *TINY, "--run-dir", str(run_dir))
    # options that only change how the run goes on are allowed, as are unchanged values
    lines = run_cli(
        capsys, "train", "--resume", str(run_dir), "--frames", "384", "--checkpoint-every",
        "128", "--num-threads", "1", "--no-quiet", "--hidden-size", "8",
    )  # fmt: skip
    assert lines[0] == f"resuming {run_dir} from frame 256 of 384"
    assert lines[1].startswith("frames 384/384 |") and lines[-1] == str(run_dir)
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256, 384]
    assert load_config(run_dir).ppo.frames == 384 and load_config(run_dir).run.quiet is False
    assert main(["train", "--resume", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_eval_prints_mean_and_std(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *TINY, "--max-episode-steps", "30", "--run-dir", str(run_dir))
    lines = run_cli(capsys, "eval", str(run_dir), "--episodes", "3")
    assert len(lines) == 1  # stdout: the result only; progress goes to stderr
    match = re.fullmatch(r"mean_return: (\d+\.\d\d) ± (\d+\.\d\d) over 3 episodes", lines[-1])
    assert match, lines[-1]
    assert 0 < float(match.group(1)) <= 30  # returns capped by max_episode_steps
    assert run_cli(capsys, "eval", str(run_dir), "--episodes", "3")[-1] == lines[-1]


def test_optional_outputs_are_skipped_with_a_note_or_written(tmp_path, capsys):
    run_dir = tmp_path / "run"
    lines = run_cli(capsys, "train", *TINY, "--run-dir", str(run_dir))
    names = {p.name for p in run_dir.iterdir()}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "note: matplotlib is not installed; no learning-curve plot." in lines
    else:
        assert "learning_curve.png" in names
    assert lines[-1] == str(run_dir)


def test_eval_shows_progress_on_stderr(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *TINY, "--max-episode-steps", "30", "--run-dir", str(run_dir))
    assert main(["eval", str(run_dir), "--episodes", "4"]) == 0
    out, err = capsys.readouterr()
    progress = err.strip().splitlines()
    assert progress and all(re.fullmatch(r"episodes done: [1-4]/4", p) for p in progress)
    assert progress[-1] == "episodes done: 4/4"
    assert out.strip().endswith("over 4 episodes")


def test_train_prints_its_dir_first_and_ends_with_a_greedy_evaluation(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = [*TINY, "--max-episode-steps", "20", "--eval-episodes", "2", "--run-dir"]
    lines = run_cli(capsys, "train", *argv, str(run_dir))
    assert lines[0] == f"run directory: {run_dir}" and lines[-1] == str(run_dir)
    greedy = re.fullmatch(r"greedy evaluation: (mean_return: .* over 2 episodes)", lines[-2])
    assert greedy, lines
    assert run_cli(capsys, "eval", str(run_dir), "--episodes", "2")[-1] == greedy.group(1)


# ---------------------------------------------------------------- resume: what may change
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished TINY run (256 frames); tests must leave it as it is."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    assert main(["train", *TINY, "--run-dir", str(run_dir)]) == 0
    return run_dir


def _snapshot(run_dir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name != ".lock"}


@pytest.mark.parametrize(
    ("option", "shown"),
    [
        (["--hidden-size", "16"], "the run has --hidden-size 8, received --hidden-size 16"),
        (["--memory", "gru"], "the run has --memory lstm, received --memory gru"),
        (["--num-layers", "2"], "the run has --num-layers 1, received --num-layers 2"),
        (["--num-envs", "4"], "the run has --num-envs 2, received --num-envs 4"),
        (["--algo", "dqn"], "the run has --algo ppo, received --algo dqn"),
        (["--env", "CartPole-v1"], "--env CartPole-masked, received --env CartPole-v1"),
        (["--max-episode-steps", "50"], "--max-episode-steps None, received"),
        (["--shared-trunk"], "the run has --no-shared-trunk, received --shared-trunk"),
        (["--seed", "3"], "the run has --seed 0, received --seed 3"),
        (["--lr", "0.001"], "the run has --lr 0.005, received --lr 0.001"),
    ],
)
def test_resume_refuses_options_that_do_not_fit_and_writes_nothing(tiny_run, capsys, option, shown):
    before = _snapshot(tiny_run)
    assert main(["train", "--resume", str(tiny_run), "--frames", "384", *option]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("recurrl train: error: --resume")
    assert shown in err and f"Fix: drop {option[0]}" in err and "--frames" in err
    assert _snapshot(tiny_run) == before  # config.json, checkpoint and metrics byte for byte


def test_resume_of_a_finished_run_says_how_to_continue(tiny_run, capsys):
    before = _snapshot(tiny_run)
    lines = run_cli(capsys, "train", "--resume", str(tiny_run))
    assert "already trained its 256 frames" in lines[0] and "--frames 512" in lines[0]
    assert lines[-1] == str(tiny_run)
    assert main(["train", "--resume", str(tiny_run), "--frames", "128"]) == 2
    assert "fewer than the 256 frames" in capsys.readouterr().err
    assert _snapshot(tiny_run) == before


def test_a_moved_run_resumes_in_its_new_place(tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "elsewhere" / "new"
    run_cli(capsys, "train", *TINY, "--run-dir", str(old))
    new.parent.mkdir()
    old.rename(new)
    lines = run_cli(capsys, "train", "--resume", str(new), "--frames", "384")
    assert lines[0] == f"resuming {new} from frame 256 of 384" and lines[-1] == str(new)
    assert load_config(new).run.run_dir == str(new)
    assert [int(r["frames"]) for r in read_metrics(new)] == [128, 256, 384]
    assert run_cli(capsys, "eval", str(new), "--episodes", "2")[-1].startswith("mean_return:")
    # an explicit --run-dir elsewhere is still refused
    assert main(["train", "--resume", str(new), "--run-dir", str(old), "--frames", "512"]) == 2
    assert "differs from --resume" in capsys.readouterr().err


# ---------------------------------------------------------------- user vs internal errors
@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--lr", "nan"], "lr must be a finite number, received nan. Fix: --lr 0.005"),
        (["--reward-scale", "inf"], "reward_scale must be a finite number"),
        (["--max-grad-norm=-inf"], "max_grad_norm must be a finite number"),
        (["--gamma", "nan"], "gamma must be a finite number"),
        (["--entropy-coef-end", "nan"], "entropy_coef_end must be a finite number"),
        (["--eval-episodes", "-1"], "eval_episodes must be >= 0"),
    ],
)
def test_user_errors_are_one_line_with_status_2(tmp_path, capsys, option, message):
    run_dir = tmp_path / "new" / "run"
    assert main(["train", *TINY, *option, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("recurrl train: error: ")
    assert message in err
    assert not (tmp_path / "new").exists()


def test_run_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("keep me")
    assert main(["train", *TINY, "--run-dir", str(path)]) == 2
    assert "is a file; expected a directory" in capsys.readouterr().err
    assert path.read_text() == "keep me"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_device_cuda_without_cuda_is_a_usage_error(tmp_path, capsys):
    assert main(["train", *TINY, "--device", "cuda", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "CUDA is not available" in err and "Fix: --device cpu" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "r").exists()


def test_unknown_flag_shows_the_subcommand_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--no-such-flag"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: recurrl train" in err and "--hidden-size" in err
    assert "recurrl train: error: unrecognized arguments: --no-such-flag" in err


def test_internal_errors_propagate_and_a_failed_start_leaves_no_run_dir(
    tmp_path, capsys, monkeypatch
):
    def broken(self, cfg, **kwargs):
        raise ValueError("an internal bug, not the user's")

    monkeypatch.setattr(PPOTrainer, "__init__", broken)
    new = tmp_path / "a" / "b"
    with pytest.raises(ValueError, match="internal bug"):  # a traceback, status 1
        main(["train", *TINY, "--run-dir", str(new)])
    assert not (tmp_path / "a").exists()
    existing = tmp_path / "mine"  # a directory that existed before is kept, with its files
    existing.mkdir()
    (existing / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="internal bug"):
        main(["train", *TINY, "--run-dir", str(existing)])
    assert (existing / "notes.txt").read_text() == "x"


def test_ctrl_c_during_the_start_leaves_no_run_dir(tmp_path, capsys, monkeypatch):
    def interrupted(self, cfg, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(PPOTrainer, "__init__", interrupted)
    assert main(["train", *TINY, "--run-dir", str(tmp_path / "run")]) == 130
    assert "recurrl train: interrupted" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_eval_of_a_missing_run_is_a_usage_error(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("recurrl eval: error: expected a run directory") and "Fix:" in err


def test_an_error_inside_training_is_one_paragraph_and_a_log(tmp_path, monkeypatch, capsys):
    def broken(self, batch):
        raise ValueError("shape mismatch deep inside the update")

    monkeypatch.setattr(PPOTrainer, "update", broken)
    assert main(["train", *TINY, "--run-dir", str(tmp_path / "run")]) == 1
    assert (tmp_path / "run" / "config.json").exists()  # the run had started: kept
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ValueError: shape mismatch deep inside the update" in err[0]
    assert "in broken (" in err[0] and "No checkpoint was saved yet" in err[0]
    assert "Traceback" in (tmp_path / "run" / "error.log").read_text()


# ---------------------------------------------------------------- signals and the lock
def _start(run_dir, *extra: str) -> subprocess.Popen:
    """``python -m recurrl train`` of a long TINY run in a subprocess."""
    argv = [sys.executable, "-m", "recurrl", "train", *TINY, "--frames", "1280000",
            "--checkpoint-every", "1280000", "--run-dir", str(run_dir), *extra]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_metrics(proc: subprocess.Popen, run_dir, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(read_metrics(run_dir)) < 1:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no metrics row: {proc.communicate()}")
        time.sleep(0.1)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.slow  # a training subprocess, signals
def test_a_signal_saves_a_checkpoint_and_says_how_to_resume(tmp_path, capsys, sig, code):
    run_dir = tmp_path / "run"
    proc = _start(run_dir)
    try:
        _wait_for_metrics(proc, run_dir)
        # a second process is refused while the first one runs
        assert main(["train", "--resume", str(run_dir)]) == 2
        assert "another recurrl process" in capsys.readouterr().err
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert f"Resume with: python -m recurrl train --resume {run_dir}" in err
    assert out.strip().splitlines()[-1] == str(run_dir)
    done = int(ckpt.load(run_dir)["frames"])
    assert int(read_metrics(run_dir)[-1]["frames"]) == done  # checkpoint at the last row
    lines = run_cli(capsys, "train", "--resume", str(run_dir), "--frames", str(done + 128))
    assert lines[0] == f"resuming {run_dir} from frame {done} of {done + 128}"
    assert [int(r["frames"]) for r in read_metrics(run_dir)][-2:] == [done, done + 128]


def test_recurrent_backend_reaches_the_recurrent_trunks(capsys):
    from recurrl.trainers.dqn import QNetwork
    from recurrl.trainers.models import ActorCritic

    assert parse_train().model.recurrent_backend == "auto"  # cpp on CPU where it builds
    cfg = parse_train("--recurrent-backend", "scan", "--memory", "gru")
    net = ActorCritic(cfg.model, 2, 2)
    assert net.actor[0].recurrent_backend == net.critic[0].recurrent_backend == "scan"
    q = QNetwork(parse_train("--algo", "dqn", "--recurrent-backend", "pad").model, 2, 2)
    assert q.q[1].recurrent_backend == "pad"
    with pytest.raises(SystemExit):
        main(["train", "--recurrent-backend", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_mingru_trains_with_the_parallel_scan_and_assoc_refuses_other_cells(tmp_path, capsys):
    from recurrl.trainers.models import ActorCritic

    cfg = parse_train("--memory", "mingru")
    net = ActorCritic(cfg.model, 2, 2)
    assert type(net.actor[0]).__name__ == "MinGRUModule"
    assert net.actor[0].recurrent_backend == "auto"  # auto: the C++ loop on CPU, else the scan
    run_dir = tmp_path / "mingru"
    lines = run_cli(capsys, "train", "--memory", "mingru", "--recurrent-backend", "assoc",
                    "--frames", "2000", "--run-dir", str(run_dir))  # fmt: skip
    assert lines[-1] == str(run_dir)
    assert main(["train", "--memory", "lstm", "--recurrent-backend", "assoc"]) == 2
    err = capsys.readouterr().err
    assert "recurrent_backend='assoc'" in err and "--memory mingru" in err


def test_lru_trains_with_the_parallel_scan_under_ppo_and_dqn(tmp_path, capsys):
    from recurrl.trainers.dqn import QNetwork
    from recurrl.trainers.models import ActorCritic

    from .test_dqn import TINY as DQN_TINY

    net = ActorCritic(parse_train("--memory", "lru").model, 2, 2)
    assert type(net.actor[0]).__name__ == "LRUModule"
    assert net.actor[0].state_keys == ["actor_y", "actor_h"]
    q = QNetwork(parse_train("--algo", "dqn", "--memory", "lru").model, 2, 2)
    assert type(q.q[1]).__name__ == "LRUModule"
    for name, argv in (("ppo", TINY), ("dqn", DQN_TINY)):
        run_dir = tmp_path / name
        lines = run_cli(capsys, "train", *argv, "--memory", "lru", "--recurrent-backend",
                        "assoc", "--run-dir", str(run_dir))  # fmt: skip
        assert lines[-1] == str(run_dir)
        assert load_config(run_dir).model.memory == "lru"


def test_resume_may_change_the_recurrent_backend(tiny_run, tmp_path, capsys):
    import shutil

    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    argv = ["train", "--resume", str(run_dir), "--frames", "384", "--recurrent-backend", "scan"]
    lines = run_cli(capsys, *argv)
    assert lines[-1] == str(run_dir)
    assert load_config(run_dir).model.recurrent_backend == "scan"
    assert [r["frames"] for r in read_metrics(run_dir)] == ["128", "256", "384"]


def test_default_run_dir_names_hold_no_path_separators_or_colons():
    from recurrl.trainers.cli import _default_run_dir

    for env in ("minigrid:MiniGrid-MemoryS7-v0", "ALE/Pong-v5"):
        cfg = parse_train("--seed", "3")
        cfg.env.env = env  # set after validation: only the name is under test
        name = Path(_default_run_dir(cfg)).name
        assert ":" not in name and "/" not in name and "-s3-" in name


def test_build_ext_compiles_the_cpp_kernels_ahead_of_time(capsys):
    from recurrl._ext import extension_unavailable_reason

    reason = extension_unavailable_reason()
    if reason is not None:
        pytest.skip(f"recurrl's C++ kernels cannot be built here: {reason}")
    assert main(["build-ext"]) == 0
    assert "built and loaded from" in capsys.readouterr().out
    from recurrl.trainers.config import ModelConfig

    assert ModelConfig(recurrent_backend="cpp").recurrent_backend == "cpp"


def test_a_backend_that_cannot_run_on_the_device_is_a_usage_error(capsys, tmp_path):
    """triton needs CUDA: on a CPU run it is refused before anything runs, with the fix."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("triton runs here")
    run_dir = tmp_path / "never"
    assert main(["train", "--recurrent-backend", "triton", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "--recurrent-backend triton with --device cpu" in err
    assert "Fix: --recurrent-backend auto." in err and not run_dir.exists()
