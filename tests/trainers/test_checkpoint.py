"""checkpoint.pt and config.json: loading never runs code, damage is reported by file name."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import random
import shutil
import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.cli import main
from recurrl.trainers.errors import CheckpointError
from recurrl.trainers.evaluate import load_config
from recurrl.trainers.logger import read_metrics
from recurrl.trainers.ppo import PPOTrainer
from tests._planted import Planted

from ._helpers import metric_numbers, parse_train, run_cli

TINY = [
    "--num-envs", "2", "--frames", "256", "--frames-per-batch", "128", "--num-minibatches", "2",
    "--epochs", "2", "--hidden-size", "8", "--quiet", "--no-plot", "--no-tensorboard",
    "--engine", "gymnasium",  # the pickled simulators of gymnasium envs
]  # fmt: skip


def test_the_planted_object_runs_when_unpickled(tmp_path):
    # the payload is live: the tests below would see the marker if anything unpickled it
    torch.load(io.BytesIO(_torch_bytes({"x": Planted(tmp_path / "m")})), weights_only=False)
    assert (tmp_path / "m").is_dir()


def _torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _framed(payload: bytes) -> bytes:
    """A checkpoint file around ``payload`` with a valid header (what a forger can write)."""
    digest = hashlib.sha256(payload).digest()
    return ckpt.MAGIC + ckpt._HEADER.pack(digest, len(payload)) + payload


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny PPO run (256 frames) whose checkpoint holds the simulators."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", *TINY, "--save-simulator", "--run-dir", str(run_dir)]) == 0
    return run_dir


@pytest.fixture
def run(trained, tmp_path):
    """A private copy of the trained run."""
    run_dir = shutil.copytree(trained, tmp_path / "run")
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["run"]["run_dir"] = str(run_dir)
    (run_dir / "config.json").write_text(json.dumps(cfg))
    return run_dir


# ---------------------------------------------------------------------- the file format
def test_round_trip_keeps_tensordicts_and_plain_data(tmp_path):
    module_state = OrderedDict(w=torch.ones(2))
    module_state._metadata = {"": {"version": 1}}
    root = TensorDict({"obs": torch.randn(2, 3), "next": {"r": torch.zeros(2, 1)}}, [2])
    state = {"root": root, "model": module_state, "rng": [3, (1, 2), None], "bytes": None}
    state["blob"] = torch.frombuffer(bytearray(b"\x00\xff"), dtype=torch.uint8)
    out = ckpt.read_file(ckpt.write_file(tmp_path / "c.pt", state))
    assert isinstance(out["root"], TensorDict) and out["root"].batch_size == (2,)
    assert (out["root"] == root).all()
    assert type(out["model"]) is OrderedDict and out["model"]._metadata == module_state._metadata
    assert out["rng"] == [3, (1, 2), None] and out["blob"].tolist() == [0, 255]
    assert not (tmp_path / "c.pt.tmp").exists()


def test_saving_an_object_that_needs_pickle_fails_at_save_time(tmp_path):
    with pytest.raises(TypeError, match=r"state\['extra'\]\['x'\] is a Planted"):
        ckpt.write_file(tmp_path / "c.pt", {"extra": {"x": Planted(tmp_path / "m")}})
    assert not (tmp_path / "c.pt").exists()


def test_rng_states_survive_the_file(tmp_path):
    ckpt.seed_everything(3)
    saved = ckpt.read_file(ckpt.write_file(tmp_path / "c.pt", {"rng": ckpt._rng_state()}))
    first = (torch.rand(3), np.random.rand(3), random.random())
    ckpt._set_rng_state(saved["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1])
    assert first[2] == again[2]


# ---------------------------------------------------------------------- planted pickles
def test_a_plain_torch_pickle_is_refused_before_unpickling(tmp_path):
    marker = tmp_path / "marker"
    (tmp_path / ckpt.CHECKPOINT).write_bytes(_torch_bytes({"model": Planted(marker)}))
    with pytest.raises(CheckpointError, match="expected a recurrl checkpoint"):
        ckpt.load(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["torch", "pickle"])
def test_a_planted_object_behind_a_valid_digest_is_refused_unexecuted(tmp_path, kind):
    marker = tmp_path / "marker"
    obj = {"model": Planted(marker)}
    payload = _torch_bytes(obj) if kind == "torch" else pickle.dumps(obj, protocol=2)
    (tmp_path / ckpt.CHECKPOINT).write_bytes(_framed(payload))
    with pytest.raises(CheckpointError, match=r"refused unexecuted.*unsupported GLOBAL"):
        ckpt.load(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_the_command_refuses_a_planted_checkpoint(run, tmp_path, capsys, command):
    marker = tmp_path / "marker"
    (run / ckpt.CHECKPOINT).write_bytes(_framed(_torch_bytes({"model": Planted(marker)})))
    argv = ["eval", str(run)] if command == "eval" else ["train", "--resume", str(run)]
    assert main([*argv, "--trust-checkpoint"] if command == "resume" else argv) == 2
    err = capsys.readouterr().err
    assert f"{run / ckpt.CHECKPOINT}: it holds objects other than tensors" in err
    assert "Traceback" not in err
    assert not marker.exists()


def _plant_simulator(run, marker) -> None:
    state = ckpt.load(run)
    assert state["simulator"] is not None and state["simulator"].dtype == torch.uint8
    blob = pickle.dumps(Planted(marker))
    state["simulator"] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    ckpt.write_file(run / ckpt.CHECKPOINT, state)


def test_a_stored_simulator_is_unpickled_only_with_the_opt_in(run, tmp_path):
    marker = tmp_path / "marker"
    _plant_simulator(run, marker)
    cfg = load_config(run)
    with pytest.warns(UserWarning, match=r"NOT restored.*--trust-checkpoint"):
        trainer = PPOTrainer(cfg, resume=True)
    assert not marker.exists()
    assert trainer.collector.rollout()["is_init"][:, 0].all()  # new episodes
    trainer.collector.shutdown()
    assert run_cli_eval(run)  # eval needs only the weights: it never opens the pickle
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="does not fit this run"):
        PPOTrainer(cfg, resume=True, trust_checkpoint=True)
    assert marker.is_dir()  # the opt-in, and only it, unpickles the simulators


def run_cli_eval(run) -> bool:
    return main(["eval", str(run), "--episodes", "2"]) == 0


# ---------------------------------------------------------------------- resuming
def test_a_trusted_resume_continues_the_saved_episodes(run):
    state = ckpt.load(run)
    trainer = PPOTrainer(load_config(run), resume=True, trust_checkpoint=True)
    saved_root = state["collector"]["root"]
    assert (trainer.collector._root == saved_root).all()  # hidden states carried on
    assert not trainer.collector.rollout()["is_init"][:, 0].all()
    trainer.collector.shutdown()


def test_a_resume_without_simulators_starts_new_episodes_and_says_so(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_cli(capsys, "train", *TINY, "--run-dir", str(run_dir))
    assert ckpt.load(run_dir)["simulator"] is None  # off by default
    with pytest.warns(UserWarning, match=r"holds no simulator state.*--save-simulator"):
        trainer = PPOTrainer(load_config(run_dir), resume=True)
    assert trainer.collector._root is None  # the saved episodes are not continued
    assert trainer.collector.rollout()["is_init"][:, 0].all()
    trainer.collector.shutdown()
    assert main(["train", "--resume", str(run_dir), "--frames", "384"]) == 0
    err = capsys.readouterr().err.splitlines()  # the command shows the warning as one line
    assert any(line.startswith("recurrl train: warning: ") and "holds no simulator state" in line
               for line in err)  # fmt: skip
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256, 384]


def test_trust_checkpoint_needs_resume(capsys):
    assert main(["train", *TINY, "--trust-checkpoint"]) == 2
    assert "--trust-checkpoint applies to a resumed run" in capsys.readouterr().err


# ---------------------------------------------------------------------- damaged files
def _damage(data: bytes, how: str) -> bytes:
    head = len(ckpt.MAGIC) + ckpt._HEADER.size
    if how == "bitflip":
        i = head + (len(data) - head) // 2
        return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]
    return {
        "empty": b"",
        "cut-in-magic": data[:5],
        "cut-in-header": data[: head - 4],
        "cut-in-data": data[: len(data) // 2],
        "appended": data + b"\x00",
        "garbage": b"\x89PNG not a checkpoint at all" * 3,
    }[how]


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("empty", "the file is empty"),
        ("cut-in-magic", "truncated"),
        ("cut-in-header", "truncated"),
        ("cut-in-data", "the file is truncated"),
        ("appended", "longer than written"),
        ("garbage", "expected a recurrl checkpoint"),
        ("bitflip", "SHA-256 digest of the data does not match"),
    ],
)
def test_a_damaged_checkpoint_is_named(run, how, message):
    path = run / ckpt.CHECKPOINT
    path.write_bytes(_damage(path.read_bytes(), how))
    with pytest.raises(CheckpointError, match=message) as info:
        ckpt.load(run)
    assert str(info.value).startswith(f"{path}: ")


def test_eval_reports_a_damaged_checkpoint_in_one_line(run, capsys):
    path = run / ckpt.CHECKPOINT
    path.write_bytes(_damage(path.read_bytes(), "bitflip"))
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: the SHA-256 digest" in err and "Traceback" not in err


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=f"no checkpoint at {tmp_path / ckpt.CHECKPOINT}"):
        ckpt.load(tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"", "the file is empty"),
        (b'{"algo": "ppo", "run": {', "not valid JSON"),
        (b"\x80\x81garbage", "not valid JSON"),
        ("[1, 2]", "the config must be a JSON object"),
        ('{"bogus": 1}', "unknown entry bogus"),
        ('{"run": {"sed": 1}}', "unknown entry run.sed"),
        ('{"run": 3}', "run must be a JSON object of RunConfig"),
        ('{"ppo": {"lr": "fast"}}', "ppo.lr must be float, received 'fast'"),
        ('{"run": {"quiet": 1}}', "run.quiet must be bool, received 1"),
        ('{"env": {"num_envs": 2.5}}', "env.num_envs must be int"),
        ('{"model": {"memory": "tcn"}}', r"memory must be one of \('lstm', 'gru', 'mingru'"),
        ('{"algo": null}', "algo must be one of 'ppo', 'dqn', received None"),
        (  # a setting __post_init__ rejects
            '{"ppo": {"frames": 1500, "frames_per_batch": 1000}}', r"Fix: --frames 2000"
        ),
    ],
)
def test_a_damaged_config_is_named(tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CheckpointError, match=message) as info:
        load_config(tmp_path)
    assert str(info.value).startswith(f"{path}: ")


def test_a_good_config_still_loads(run):
    cfg = load_config(run)
    assert cfg.run.save_simulator is True
    assert json.loads((run / "config.json").read_text())["run"]["save_simulator"] is True


# ---------------------------------------------------------------------- torch envs
def test_a_torch_engine_run_resumes_its_episodes_exactly_without_any_option(tmp_path, capsys):
    """recurrl's torch envs are checkpointed as plain tensors: no pickle, no opt-in, and the
    interrupted run resumed replays the uninterrupted one number for number."""
    tiny = [a for a in TINY if a not in ("--engine", "gymnasium")]
    argv = [*tiny, "--engine", "torch", "--frames", "384", "--checkpoint-every", "128"]
    run_cli(capsys, "train", *argv, "--run-dir", str(tmp_path / "full"))
    cut = tmp_path / "cut"
    cfg = parse_train(*argv, "--run-dir", str(cut))
    cut.mkdir()
    (cut / "config.json").write_text(json.dumps(cfg.to_dict()))
    PPOTrainer(cfg).train(stop_after=256)
    state = ckpt.load(cut)
    assert state["simulator"] is None and {"state", "steps"} <= set(state["simulator_tensors"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the episodes go on
        trainer = PPOTrainer(load_config(cut), resume=True)
    assert (trainer.collector._root == state["collector"]["root"]).all()
    trainer.collector.shutdown()
    run_cli(capsys, "train", "--resume", str(cut))
    assert metric_numbers(cut) == metric_numbers(tmp_path / "full")


def test_a_torch_env_state_of_another_size_is_refused(tmp_path):
    from recurrl.envs import CartPoleEnv

    saved = CartPoleEnv(2, seed=0).simulator_tensors()
    with pytest.raises(ValueError, match=r"entry 'steps' must be \(3,\).*num_envs=3"):
        CartPoleEnv(3, seed=0).load_simulator_tensors(saved)
    with pytest.raises(ValueError, match="expected the entries"):
        CartPoleEnv(2, seed=0).load_simulator_tensors({"steps": saved["steps"]})
