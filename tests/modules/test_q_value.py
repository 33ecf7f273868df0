"""Tests of recurrl.modules.q_value: QValueModule and the action-space helper."""

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs import Bounded, Categorical, Composite, OneHot
from recurrl.modules import QValueModule
from recurrl.modules.q_value import action_space_name

VALUES = torch.tensor([[1.0, 3.0, 2.0], [5.0, -1.0, 0.0], [0.0, 0.0, 4.0]])


def test_categorical_outputs_by_hand():
    td = QValueModule("categorical")(TensorDict({"action_value": VALUES.clone()}, [3]))
    assert td["action"].tolist() == [1, 0, 2] and td["action"].dtype == torch.int64
    assert td["chosen_action_value"].tolist() == [[3.0], [5.0], [4.0]]
    torch.testing.assert_close(td["action_value"], VALUES)


def test_one_hot_outputs_by_hand_and_spec_dtype():
    td = QValueModule("one-hot")(TensorDict({"action_value": VALUES.clone()}, [3]))
    assert td["action"].tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 1]]
    assert td["action"].dtype == torch.int64  # the reference's dtype without a spec
    assert td["chosen_action_value"].squeeze(-1).tolist() == [3.0, 5.0, 4.0]
    with_spec = QValueModule(spec=OneHot(3))(TensorDict({"action_value": VALUES.clone()}, [3]))
    assert with_spec["action"].dtype == torch.bool and OneHot(3, shape=(3, 3)).is_in(
        with_spec["action"]
    )


def test_ties_give_one_action():
    td = QValueModule("one_hot")(TensorDict({"action_value": torch.zeros(2, 4)}, [2]))
    assert td["action"].sum(-1).tolist() == [1, 1]


def test_action_space_from_spec_and_composite():
    assert QValueModule(spec=Categorical(3)).action_space == "categorical"
    assert QValueModule(action_space=None, spec=OneHot(3)).action_space == "one_hot"
    comp = Composite(action=Categorical(3))
    module = QValueModule(spec=comp)
    assert module.spec == Categorical(3)


def test_custom_keys_and_mask():
    qval = QValueModule(
        "categorical",
        action_value_key="q",
        action_mask_key="mask",
        out_keys=["a", "q", "qa"],
    )
    assert qval.in_keys == ["q", "mask"] and qval.out_keys == ["a", "q", "qa"]
    mask = torch.tensor([[True, False, True], [False, True, True], [True, True, False]])
    td = qval(TensorDict({"q": VALUES.clone(), "mask": mask}, [3]))
    assert td["a"].tolist() == [2, 2, 0]
    assert td["qa"].squeeze(-1).tolist() == [2.0, 0.0, 0.0]


def test_keyword_tensor_call():
    action, _values, chosen = QValueModule("categorical")(action_value=VALUES)
    assert action.tolist() == [1, 0, 2] and chosen.shape == (3, 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "action space is unknown"),
        ({"action_space": "binary"}, "expected action_space in"),
        ({"action_space": "one_hot", "spec": Categorical(3)}, "contradicts the spec"),
        ({"spec": Bounded(-1.0, 1.0, shape=(2,))}, "Categorical or OneHot"),
        ({"action_space": "categorical", "var_nums": 2}, "multi-one-hot"),
        ({"action_space": "categorical", "out_keys": ["a", "b", "c"]}, "expected out_keys"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QValueModule(**kwargs)


def test_missing_values_raise_keyerror():
    with pytest.raises(KeyError, match="action values 'action_value' are missing"):
        QValueModule("categorical")(TensorDict({}, [2]))


def test_action_space_name_accepts_specs_in_action_space():
    assert action_space_name(OneHot(2), owner="t") == "one_hot"
    assert action_space_name(Categorical(2), Categorical(2), owner="t") == "categorical"
