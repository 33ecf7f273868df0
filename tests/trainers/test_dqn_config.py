"""DQNConfig: the DQN section of TrainConfig (its own module, importable from config)."""

from __future__ import annotations

import pytest

from recurrl.trainers import DQNConfig as exported
from recurrl.trainers.config import DQNConfig, TrainConfig, field_docs


def test_one_class_under_every_import_path_with_its_help_texts():
    assert exported is DQNConfig is type(TrainConfig().dqn)
    docs = field_docs(DQNConfig)
    assert "epsilon_schedule" in docs and "burn_in" in docs  # the CLI's --help texts


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epsilon_schedule": "linear"}, "epsilon_schedule must be decay or apex"),
        ({"apex_epsilon": 0.0}, r"apex_epsilon must be in \(0, 1\]"),
        ({"priority_alpha": -1.0}, "priority_alpha must be >= 0"),
        ({"slice_start": "middle"}, "slice_start must be any, trajectory or stride"),
        ({"replay_seed": -1}, r"replay_seed must be an int >= 0.*--replay-seed 0"),
        ({"replay_seed": 1.5}, "replay_seed must be an int >= 0"),
    ],
)
def test_bad_values_are_refused_with_the_fix(changes, message):
    with pytest.raises(ValueError, match=message):
        DQNConfig(**changes)
