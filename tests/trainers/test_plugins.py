"""Plugins: a toy cell, its module and a toy backend, each added in one file with one
registration, trained and evaluated through ``recurrl train`` / ``recurrl eval``."""

from __future__ import annotations

import json
import sys

import pytest

from recurrl.functional.recurrent import RECURRENT_BACKEND_REGISTRY
from recurrl.functional.recurrent.cell import CELL_KINDS, unregister_cell_kind
from recurrl.modules import MEMORY_REGISTRY
from recurrl.modules.registry import unregister_memory
from recurrl.trainers import plugins
from recurrl.trainers.cli import main
from recurrl.trainers.errors import UsageError

from ._helpers import run_cli

TOY = "tests.trainers.toy_plugin"


@pytest.fixture
def toy_plugin(monkeypatch):
    """``$RECURRL_PLUGINS`` naming the toy plugin; everything it registered is removed after."""
    monkeypatch.setenv(plugins.ENV_VAR, TOY)
    yield
    if "toy_elman" in MEMORY_REGISTRY:
        unregister_memory("toy_elman")
    if "toy_elman" in CELL_KINDS:
        unregister_cell_kind("toy_elman")
    RECURRENT_BACKEND_REGISTRY.pop("toy_loop", None)
    sys.modules.pop(TOY, None)
    if TOY in plugins._loaded:
        plugins._loaded.remove(TOY)


def test_a_toy_cell_and_backend_train_and_evaluate_through_the_cli(toy_plugin, tmp_path, capsys):
    run_dir = tmp_path / "toy"
    lines = run_cli(
        capsys, "train", "--memory", "toy_elman", "--recurrent-backend", "toy_loop",
        "--frames", "2000", "--epochs", "1", "--run-dir", str(run_dir), "--no-plot",
    )  # fmt: skip
    assert lines[-1] == str(run_dir)
    saved = json.loads((run_dir / "config.json").read_text())["model"]
    assert (saved["memory"], saved["recurrent_backend"]) == ("toy_elman", "toy_loop")
    # a later command (eval, resume) finds the plugin's names again through the variable
    assert "mean_return" in run_cli(capsys, "eval", str(run_dir), "--episodes", "1")[-1]


def test_the_plugin_names_are_choices_of_the_parser(toy_plugin, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "toy_elman" in out and "toy_loop" in out


def test_without_the_plugin_its_names_are_refused_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--memory", "toy_elman"])
    assert info.value.code == 2
    assert "invalid choice: 'toy_elman'" in capsys.readouterr().err


def test_a_plugin_that_cannot_be_imported_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv(plugins.ENV_VAR, "no_such_recurrl_plugin")
    with pytest.raises(UsageError, match="names the module 'no_such_recurrl_plugin'"):
        plugins.load_plugins()
    assert main(["train", "--frames", "1000"]) == 2
    err = capsys.readouterr().err
    assert "ModuleNotFoundError" in err and f"remove it from {plugins.ENV_VAR}" in err
