"""Argument checks of the slice samplers (``recurrl/data/samplers/_slice_args.py``): every
contradictory or malformed argument is refused at construction, naming the fix."""

from __future__ import annotations

import pytest
import torch

from recurrl.data import SliceSampler, SliceSamplerWithoutReplacement

SAMPLERS = {"with_replacement": SliceSampler, "without_replacement": SliceSamplerWithoutReplacement}
END_KEYS = [("next", "done"), ("next", "truncated")]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of num_slices"),
        ({"num_slices": 2, "slice_len": 3}, "exactly one of num_slices"),
        ({"slice_len": 0}, "positive int"),
        ({"slice_len": 2, "pad_output": True}, "nothing to pad"),
        ({"slice_len": 2, "span": -1}, "expected span"),
        ({"slice_len": 2, "span": (True, 1, 2)}, "expected span"),
        ({"slice_len": 2, "span": True, "min_slice_len": 1, "strict_length": False}, "only one"),
        ({"slice_len": 2, "drop_last": True}, "replacement=False"),
        ({"slice_len": 2, "shuffle": False}, "replacement=False"),
        (
            {
                "slice_len": 2,
                "ends": torch.zeros(3, dtype=torch.bool),
                "trajectories": torch.zeros(3, dtype=torch.long),
            },
            "at most one of ends",
        ),
        ({"slice_len": 2, "ends": torch.zeros(3).bool(), "end_key": "a"}, "drop the keys"),
        ({"slice_len": 2, "ends": torch.zeros(3)}, "bool tensor"),
        ({"slice_len": 2, "trajectories": torch.zeros(3, 1, dtype=torch.long)}, "1-D tensor"),
        ({"slice_len": 2, "trajectories": torch.zeros(3)}, "integer tensor"),
        ({"slice_len": 2, "min_slice_len": 0, "strict_length": False}, "positive int"),
        ({"slice_len": 2, "min_slice_len": 3, "strict_length": False}, "min_slice_len <= slice"),
        ({"slice_len": 4, "min_slice_len": 2}, "strict_length=False"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SliceSampler(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"end_key": ("next", "done"), "end_keys": END_KEYS}, "exclusive"),
        ({"end_keys": ("next", "done")}, "single"),
        ({"end_keys": "done"}, "single"),
        ({"end_keys": []}, "non-empty list"),
        ({"end_keys": [("next", "done"), 3]}, "every entry of end_keys"),
        ({"end_keys": END_KEYS, "ends": torch.zeros(3).bool()}, "drop the keys"),
        ({"init_key": ("next", "truncated")}, "slice starts"),
        ({"init_key": "flag", "truncated_key": "flag"}, "slice starts"),
        ({"init_key": ("next", "done")}, "slice starts"),
        ({"init_key": 3}, "expected init_key"),
        ({"step_key": ["a", 1]}, "expected step_key"),
        ({"traj_key": ()}, "expected traj_key"),
        ({"fragmented": True, "step_key": None}, "step_key=None"),
        ({"fragmented": True, "end_key": ("next", "done")}, "would be ignored"),
        ({"fragmented": True, "end_keys": END_KEYS}, "would be ignored"),
        ({"fragmented": True, "trajectories": torch.zeros(3).long()}, "cannot be used"),
    ],
)
@pytest.mark.parametrize("name", SAMPLERS)
def test_invalid_end_init_step_keys(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SAMPLERS[name](slice_len=2, **kwargs)
