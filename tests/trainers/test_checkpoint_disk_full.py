"""A checkpoint write that fails (a full disk): one line, the previous checkpoint intact."""

from __future__ import annotations

import builtins
import errno
from pathlib import Path
from typing import Any

import pytest
import torch

from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.cli import main
from recurrl.trainers.logger import read_metrics

# 2 envs x 64 steps per batch, 3 batches, a checkpoint after each: a second or two
TINY = [
    "--num-envs", "2", "--frames", "384", "--frames-per-batch", "128",
    "--num-minibatches", "2", "--epochs", "1", "--hidden-size", "8", "--quiet",
    "--eval-episodes", "0", "--no-tensorboard", "--no-plot", "--checkpoint-every", "128",
]  # fmt: skip


class _FillingFile:
    """A file whose disk fills after ``room`` bytes: the rest of a write raises ENOSPC."""

    def __init__(self, f: Any, room: int) -> None:
        self._f, self._room = f, room

    def write(self, data: bytes) -> int:
        if len(data) > self._room:
            self._f.write(data[: self._room])
            self._room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _FillingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def fill_disk_after(monkeypatch: pytest.MonkeyPatch, writes: int, room: int = 64) -> None:
    """Let the checkpoint module write ``writes`` files fully, then fill the disk ``room``
    bytes into each next one."""
    opened = [0]

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = builtins.open(file, mode, *args, **kwargs)  # noqa: SIM115 (returned, as open does)
        if "w" not in mode:
            return f
        opened[0] += 1
        return f if opened[0] <= writes else _FillingFile(f, room)

    monkeypatch.setattr(ckpt, "open", open_, raising=False)  # shadows the builtin there


def test_a_full_disk_keeps_the_previous_file_and_says_where_and_how_much(tmp_path, monkeypatch):
    path = tmp_path / ckpt.CHECKPOINT
    ckpt.write_file(path, {"frames": 128, "w": torch.ones(3)})
    before = path.read_bytes()
    new = {"frames": 256, "w": torch.zeros(1000)}
    needed = ckpt.write_file(tmp_path / "same-size.pt", new).stat().st_size
    fill_disk_after(monkeypatch, writes=0)
    with pytest.raises(ckpt.CheckpointWriteError) as info:
        ckpt.write_file(path, new)
    message = str(info.value)
    assert f"cannot write the checkpoint {path}: no space left on device" in message
    assert f"free on the filesystem of {tmp_path}; the checkpoint needs {ckpt._size(needed)})" in (
        message
    )
    assert "The previous checkpoint in checkpoint.pt is intact." in message
    assert f"Fix: free at least {ckpt._size(needed)}" in message
    assert f"`recurrl train --resume {tmp_path}` continues from it" in message
    assert isinstance(info.value, ckpt.CheckpointError) and info.value.path == path
    assert info.value.free is not None and f"{ckpt._size(info.value.free)} free" in message
    assert info.value.__cause__.errno == errno.ENOSPC
    assert path.read_bytes() == before  # untouched
    assert ckpt.read_file(path)["frames"] == 128
    assert sorted(p.name for p in tmp_path.iterdir()) == [ckpt.CHECKPOINT, "same-size.pt"]


def test_a_first_checkpoint_that_fails_says_to_start_again(tmp_path, monkeypatch):
    fill_disk_after(monkeypatch, writes=0)
    with pytest.raises(ckpt.CheckpointWriteError, match="No checkpoint had been saved yet"):
        ckpt.write_file(tmp_path / ckpt.CHECKPOINT, {"frames": 128})
    assert list(tmp_path.iterdir()) == []


def test_other_write_errors_name_the_file_and_the_fix(tmp_path, monkeypatch):
    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(ckpt, "open", read_only, raising=False)
    with pytest.raises(ckpt.CheckpointWriteError) as info:
        ckpt.write_file(tmp_path / ckpt.CHECKPOINT, {"frames": 128})
    message = str(info.value)
    assert "cannot write the checkpoint" in message and "Read-only file system" in message
    assert f"Fix: make {tmp_path} writable" in message


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (4_200_000, "4.2 MB"), (1.5e12, "1.5 TB")],
)
def test_sizes_read_in_decimal_units(n, text):
    assert ckpt._size(int(n)) == text


def test_train_ends_with_one_line_and_a_resumable_run(tmp_path, monkeypatch, capsys):
    """The second checkpoint hits a full disk: ``recurrl train`` prints one line (no
    traceback) naming the file and the free space and exits non-zero; the first checkpoint,
    the config and the metrics are what a resume needs."""
    run_dir = tmp_path / "run"
    fill_disk_after(monkeypatch, writes=1)
    status = main(["train", *TINY, "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert status == 2
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in err
    line = lines[0]
    assert line.startswith(f"recurrl train: error: cannot write the checkpoint {run_dir}")
    assert "no space left on device" in line and "free on the filesystem of" in line
    assert "Fix: free at least" in line and f"recurrl train --resume {run_dir}" in line
    assert ckpt.load(run_dir)["frames"] == 128  # the previous checkpoint, intact
    assert not (run_dir / f"{ckpt.CHECKPOINT}.tmp").exists()
    assert (run_dir / "config.json").is_file()
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256]

    monkeypatch.setattr(ckpt, "open", builtins.open)  # room again: the run resumes
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert ckpt.load(run_dir)["frames"] == 384
    assert [int(r["frames"]) for r in read_metrics(run_dir)] == [128, 256, 384]
    assert Path(capsys.readouterr().out.strip().splitlines()[-1]) == run_dir
