"""The samplers' constructor arguments (``recurrl/data/samplers/_options.py``): written once per
option group, every sampler's signature, checks, attributes and docstring come from them."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest
import torch

from recurrl.data.samplers import (
    PrioritizedSliceSampler,
    PrioritizedTapeSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TapeSampler,
)
from recurrl.data.samplers._options import option_groups, takes
from recurrl.data.samplers._priority_args import PriorityOptions
from recurrl.data.samplers._slice_args import SliceOptions
from recurrl.data.samplers._tape_args import TapeOptions
from recurrl.modules._arg_docs import argument_entries

PRIORITY = (10, 0.5, 0.4)  # max_capacity, alpha, beta
#: each sampler, the positional arguments it needs, and the arguments it leaves out
SAMPLERS = {
    SliceSampler: ((), set()),
    SliceSamplerWithoutReplacement: ((), {"replacement"}),
    PrioritizedSliceSampler: (PRIORITY, {"replacement", "drop_last", "shuffle"}),
    TapeSampler: ((), set()),
    PrioritizedTapeSampler: (PRIORITY, {"reduction", "max_priority_within_buffer", "weight"}),
}
#: the reference's positional arguments, in order (every other argument is keyword-only)
POSITIONAL = {
    PrioritizedSliceSampler: ["max_capacity", "alpha", "beta", "eps", "dtype", "reduction"],
    PrioritizedTapeSampler: ["max_capacity", "alpha", "beta", "eps", "dtype"],
}


def _init_fields(group: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(group) if f.init]


def _build(cls, **kwargs):
    args, _ = SAMPLERS[cls]
    if issubclass(cls, SliceSampler):
        kwargs.setdefault("slice_len", 4)
    return cls(*args, **kwargs)


@pytest.mark.parametrize("cls", SAMPLERS)
def test_the_signature_is_the_groups_fields_minus_those_left_out(cls):
    params = list(inspect.signature(cls).parameters.values())
    assert all(p.kind is not p.VAR_KEYWORD and p.kind is not p.VAR_POSITIONAL for p in params)
    fields = [f for g in option_groups(cls) for f in _init_fields(g)]
    left_out = SAMPLERS[cls][1]
    assert [p.name for p in params] == [f.name for f in fields if f.name not in left_out]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == POSITIONAL.get(cls, [])
    by_name = {f.name: f for f in fields}
    for p in params:  # the group's default, but where a sampler names another one
        if not (cls is SliceSamplerWithoutReplacement and p.name in ("drop_last", "shuffle")):
            assert p.default == by_name[p.name].default or (
                p.default is p.empty and by_name[p.name].default is dataclasses.MISSING
            ), p.name


def test_without_replacement_defaults():
    params = inspect.signature(SliceSamplerWithoutReplacement).parameters
    assert (params["drop_last"].default, params["shuffle"].default) == (False, True)
    sampler = SliceSamplerWithoutReplacement(slice_len=2)
    assert (sampler.replacement, sampler.drop_last, sampler.shuffle) == (False, False, True)


@pytest.mark.parametrize("cls", SAMPLERS)
def test_every_argument_is_documented_in_signature_order(cls):
    params = list(inspect.signature(cls).parameters.values())
    doc = inspect.cleandoc(cls.__doc__)
    for header, kind in (("Args:", "POSITIONAL_OR_KEYWORD"), ("Keyword Args:", "KEYWORD_ONLY")):
        part = doc.split(f"\n{header}\n", 1)
        body = part[1].split("\n\n", 1)[0] if len(part) == 2 else ""
        listed = list(argument_entries(f"Summary.\n\n{header}\n{body}"))
        assert listed == [p.name for p in params if p.kind.name == kind], header


@pytest.mark.parametrize("group", [SliceOptions, TapeOptions, PriorityOptions])
def test_each_group_documents_each_of_its_arguments_once(group):
    assert list(argument_entries(group.__doc__)) == [f.name for f in _init_fields(group)]


@pytest.mark.parametrize("cls", SAMPLERS)
def test_a_sampler_module_does_not_repeat_its_groups_entries(cls):
    """The shared entries live in the groups; a sampler documents only its own wording."""
    own = argument_entries(inspect.getsource(cls).split('"""')[1])  # its docstring as written
    shared = {name: lines for g in option_groups(cls) for name, lines in
              argument_entries(g.__doc__).items()}  # fmt: skip
    assert not [name for name in own if own[name] == shared.get(name)]


@pytest.mark.parametrize("cls", SAMPLERS)
def test_every_argument_is_an_attribute_with_its_checked_value(cls):
    sampler = _build(cls, truncated_key=["next", "cut"], init_key=("start",))
    assert (sampler.truncated_key, sampler.init_key) == (("next", "cut"), "start")
    assert sampler.generator is None
    for group in option_groups(cls):
        held = sampler.priority_options if group is PriorityOptions else sampler.options
        assert isinstance(held, group)
        for f in _init_fields(group):
            if not isinstance(inspect.getattr_static(cls, f.name, None), property):
                assert getattr(sampler, f.name) is getattr(held, f.name), f.name


def test_derived_attributes_of_the_slice_samplers():
    sampler = SliceSampler(slice_len=4, span=(True, 1), end_keys=[["next", "done"]])
    assert sampler.span == (True, 1) == sampler.options.span  # as given, as the reference
    assert sampler._span_sides == (-1, 1)  # parsed: (all but one, 1) steps may be missing
    assert sampler.end_keys == (("next", "done"),)
    assert (sampler.drop_last, sampler.shuffle) == (False, True)
    sampler = SliceSampler(slice_len=4, replacement=False, shuffle=False)
    assert (sampler.replacement, sampler.drop_last, sampler.shuffle) == (False, False, False)


def test_numbers_are_normalised_once():
    sampler = PrioritizedSliceSampler(10, 1, 0, eps=0, eta=1, uniform_mix=0, slice_len=2)
    values = (sampler.alpha, sampler.beta, sampler.eps, sampler.eta, sampler.uniform_mix)
    assert values == (1.0, 0.0, 0.0, 1.0, 0.0)
    assert all(type(v) is float for v in values)


@pytest.mark.parametrize("cls", SAMPLERS)
def test_a_misspelt_argument_names_the_sampler_and_the_fix(cls):
    with pytest.raises(TypeError, match=rf"^{cls.__name__}: .*'generatr'.*did you mean generator="):
        _build(cls, generatr=None)


@pytest.mark.parametrize("cls", SAMPLERS)
def test_a_left_out_argument_is_refused(cls):
    for name in SAMPLERS[cls][1]:
        with pytest.raises(TypeError, match=rf"{cls.__name__}: .*'{name}'.*pass only its"):
            _build(cls, **{name: False})


def test_missing_and_extra_positional_arguments():
    with pytest.raises(TypeError, match=r"PrioritizedSliceSampler: missing .*'beta'"):
        PrioritizedSliceSampler(10, 1.0, slice_len=2)
    with pytest.raises(TypeError, match="PrioritizedTapeSampler: too many positional"):
        PrioritizedTapeSampler(10, 1.0, 1.0, 1e-8, torch.float32, "max")
    sampler = PrioritizedSliceSampler(10, 1.0, 1.0, 0.1, torch.float64, "mean", slice_len=2)
    assert (sampler.eps, sampler.dtype, sampler.reduction) == (0.1, torch.float64, "mean")


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: SliceSamplerWithoutReplacement(slice_len=0), "SliceSamplerWithoutReplacement: "),
        (lambda: PrioritizedSliceSampler(*PRIORITY, num_slices=2, slice_len=2),
         "PrioritizedSliceSampler: expected exactly one"),
        (lambda: PrioritizedTapeSampler(*PRIORITY, num_tapes=0), "PrioritizedTapeSampler: "),
        (lambda: PrioritizedTapeSampler(*PRIORITY, traj_key=3), "PrioritizedTapeSampler: "),
        (lambda: TapeSampler(step_key=[1]), "TapeSampler: expected step_key"),
    ],
)  # fmt: skip
def test_errors_name_the_sampler_being_built(build, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        build()


@pytest.mark.parametrize("cls", SAMPLERS)
def test_a_sampler_pickles_with_its_arguments(cls):
    sampler = _build(cls, generator=torch.Generator().manual_seed(3))
    again = pickle.loads(pickle.dumps(sampler))
    assert again.options == sampler.options
    assert sorted(vars(again)) == sorted(vars(sampler))
    assert again.generator.initial_seed() == 3


def test_a_subclass_built_through_its_parent_names_itself():
    class Short(SliceSampler):
        def __init__(self, **kwargs) -> None:
            super().__init__(slice_len=2, **kwargs)

    assert Short(strict_length=False).strict_length is False
    with pytest.raises(TypeError, match=r"^Short: got an unexpected keyword argument 'x'"):
        Short(x=1)
    with pytest.raises(ValueError, match=r"^Short: pad_output=True"):
        Short(pad_output=True)


def test_takes_refuses_names_that_are_not_fields():
    with pytest.raises(ValueError, match="exclude names"):
        takes(TapeOptions, exclude=["weigth"])
    with pytest.raises(ValueError, match="fixed values are for excluded fields"):
        takes(TapeOptions, fixed={"weight": "length"})
