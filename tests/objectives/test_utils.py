import pytest
import torch
from tensordict.nn import TensorDictModule

from recurrl.objectives import DQNLoss
from recurrl.objectives.utils import TargetNetUpdater


def test_an_updater_without_step_names_the_fix():
    class Mine(TargetNetUpdater):
        pass

    loss = DQNLoss(TensorDictModule(torch.nn.Linear(2, 3), ["obs"], ["action_value"]))
    with pytest.raises(NotImplementedError, match=r"Mine does not implement step.*SoftUpdate"):
        Mine(loss).step()

