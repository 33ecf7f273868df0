"""Evaluation inputs: a run directory that is missing, incomplete or altered is a user error."""

from __future__ import annotations

import json

import pytest

from recurrl.trainers.config import TrainConfig
from recurrl.trainers.errors import CheckpointError, UsageError
from recurrl.trainers.evaluate import evaluate, load_config, require_checkpoint


def test_load_config_names_what_is_wrong(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_config(tmp_path / "missing")
    with pytest.raises(CheckpointError, match=r"holds no config\.json"):
        load_config(tmp_path)
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_config(tmp_path)
    data = TrainConfig().to_dict()
    data["model"]["hidden_size"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="hidden_size"):
        load_config(tmp_path)
    data["model"] = {"hidden_size": 8, "colour": "red"}  # an entry no config has
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="colour"):
        load_config(tmp_path)


def test_a_run_without_checkpoint_or_episodes_is_a_user_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TrainConfig().to_dict()))
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt"):
        require_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt"):
        evaluate(tmp_path)
    with pytest.raises(UsageError, match="episodes must be >= 1"):
        evaluate(tmp_path, episodes=0)


def test_a_run_written_before_an_option_existed_loads_with_what_it_ran(tmp_path):
    data = TrainConfig().to_dict()
    del data["model"]["recurrent_backend"]  # config.json of a run older than the option
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert load_config(tmp_path).model.recurrent_backend == "pad"  # not today's default
    data["model"]["recurrent_backend"] = "scan"
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert load_config(tmp_path).model.recurrent_backend == "scan"
