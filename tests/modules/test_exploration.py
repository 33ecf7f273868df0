"""Tests of recurrl.modules.exploration: EGreedyModule and the exploration type."""

import pytest
import tensordict.nn
import torch
from tensordict import TensorDict

from recurrl.envs import Categorical, Composite, OneHot
from recurrl.envs import ExplorationType as EnvsExplorationType
from recurrl.modules import EGreedyModule, ExplorationType, exploration_type, set_exploration_type


def test_exploration_type_is_tensordicts():
    # the reference re-exports tensordict's interaction type under these names
    assert ExplorationType is tensordict.nn.InteractionType is EnvsExplorationType
    assert exploration_type() is None
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        assert exploration_type() is ExplorationType.DETERMINISTIC
        # tensordict.nn.probabilistic: where tensordict 0.14.x (no re-export) and 0.15.x define it
        assert tensordict.nn.probabilistic.interaction_type() is ExplorationType.DETERMINISTIC


def test_eps_schedule_by_hand():
    module = EGreedyModule(Categorical(2), eps_init=0.5, eps_end=0.1, annealing_num_steps=8)
    # (0.5 - 0.1) / 8 = 0.05 per frame
    module.step(2)
    assert float(module.eps) == pytest.approx(0.4)
    for _ in range(3):
        module.step()
    assert float(module.eps) == pytest.approx(0.25)
    module.step(100)
    assert float(module.eps) == pytest.approx(0.1)
    # step(n) == n calls of step(1) (the reference loops)
    a = EGreedyModule(Categorical(2), eps_init=0.2, annealing_num_steps=1_000_000)
    b = EGreedyModule(Categorical(2), eps_init=0.2, annealing_num_steps=1_000_000)
    a.step(50)
    for _ in range(50):
        b.step(1)
    torch.testing.assert_close(a.eps, b.eps)


def test_replacement_rate_and_values_categorical():
    torch.manual_seed(0)
    module = EGreedyModule(Categorical(4), eps_init=0.25, eps_end=0.25)
    greedy = torch.full((20_000,), 3)
    out = module(TensorDict({"action": greedy.clone()}, [20_000]))["action"]
    changed = (out != 3).float().mean().item()
    # a replaced action is uniform over 4 actions: it stays 3 with probability 1/4
    assert changed == pytest.approx(0.25 * 0.75, abs=0.01)
    assert set(out.unique().tolist()) <= {0, 1, 2, 3}


def test_one_hot_actions_are_replaced_whole():
    torch.manual_seed(0)
    module = EGreedyModule(OneHot(3), eps_init=1.0, eps_end=1.0)
    greedy = torch.zeros(1000, 3, dtype=torch.bool)
    greedy[:, 0] = True
    out = module(TensorDict({"action": greedy.clone()}, [1000]))["action"]
    assert out.dtype == torch.bool and bool((out.sum(-1) == 1).all())
    assert (out[:, 0] == 0).float().mean().item() == pytest.approx(2 / 3, abs=0.05)


def test_batched_spec_and_unbatched_spec():
    torch.manual_seed(0)
    batched = EGreedyModule(Categorical(5, shape=(8,)), eps_init=1.0, eps_end=1.0)
    out = batched(TensorDict({"action": torch.zeros(8, dtype=torch.long)}, [8]))["action"]
    assert out.shape == (8,) and bool((out != 0).any())
    unbatched = EGreedyModule(Composite(action=Categorical(5)), eps_init=1.0, eps_end=1.0)
    out = unbatched(TensorDict({"action": torch.zeros(8, dtype=torch.long)}, [8]))["action"]
    assert out.shape == (8,)


@pytest.mark.parametrize("mode", [ExplorationType.DETERMINISTIC, ExplorationType.MODE])
def test_only_explores_in_random_mode(mode):
    module = EGreedyModule(Categorical(4), eps_init=1.0, eps_end=1.0)
    td = TensorDict({"action": torch.zeros(500, dtype=torch.long)}, [500])
    with set_exploration_type(mode):
        assert bool((module(td.clone())["action"] == 0).all())
    with set_exploration_type(ExplorationType.RANDOM):
        assert bool((module(td.clone())["action"] != 0).any())


def test_action_mask_draws_allowed_actions_only():
    torch.manual_seed(0)
    module = EGreedyModule(
        Categorical(4), eps_init=1.0, eps_end=1.0, action_mask_key="mask"
    )
    mask = torch.tensor([False, True, False, True]).expand(1000, 4)
    td = TensorDict({"action": torch.ones(1000, dtype=torch.long), "mask": mask}, [1000])
    out = module(td)["action"]
    assert set(out.unique().tolist()) == {1, 3}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"spec": None}, TypeError, "spec=env.action_spec"),
        ({"spec": Categorical(2), "eps_init": 0.1, "eps_end": 0.2}, ValueError, "eps_end <="),
        ({"spec": Categorical(2), "annealing_num_steps": 0}, ValueError, "annealing_num_steps"),
    ],
)
def test_bad_arguments_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        EGreedyModule(**kwargs)


def test_missing_action_and_wrong_shape_raise():
    module = EGreedyModule(Categorical(3, shape=(2,)))
    with pytest.raises(KeyError, match="no action under 'action'"):
        module(TensorDict({}, [2]))
    with pytest.raises(ValueError, match="does not end with the spec shape"):
        module(TensorDict({"action": torch.zeros(5, dtype=torch.long)}, [5]))


def test_unbatched_tensordict():
    # an unbatched env's step: batch [], action [] (categorical) or [n] (one-hot)
    torch.manual_seed(0)
    module = EGreedyModule(Categorical(3), eps_init=1.0, eps_end=1.0)
    seen = {int(module(TensorDict({"action": torch.tensor(0)}, []))["action"]) for _ in range(50)}
    assert seen == {0, 1, 2}
    one_hot = EGreedyModule(OneHot(3), eps_init=1.0, eps_end=1.0)
    out = one_hot(TensorDict({"action": torch.tensor([True, False, False])}, []))["action"]
    assert out.shape == (3,) and int(out.sum()) == 1
