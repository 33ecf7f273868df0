"""Tests of recurrl.envs.utils: step_mdp, get_reset_mask, where_reset, merge_reset."""

import pytest
import torch
from tensordict import TensorDict

from recurrl.envs.utils import (
    count_true,
    get_reset_mask,
    merge_reset,
    prime_reset_mask,
    reset_mask_any_all,
    set_next,
    step_mdp,
    tensordict_of_checked,
    update_checked,
    where_reset,
)


def make_td():
    b = [2]
    return TensorDict(
        {
            "obs": torch.zeros(2, 3),
            "action": torch.ones(2),
            "logits": torch.ones(2, 2),
            "done": torch.zeros(2, 1, dtype=torch.bool),
            "_reset": torch.ones(2, 1, dtype=torch.bool),
            "next": {
                "obs": torch.ones(2, 3),
                "reward": torch.ones(2, 1),
                "done": torch.ones(2, 1, dtype=torch.bool),
                "terminated": torch.ones(2, 1, dtype=torch.bool),
                "truncated": torch.zeros(2, 1, dtype=torch.bool),
                "agent": {"h": torch.full((2, 4), 7.0)},
            },
        },
        batch_size=b,
    )


def leaf_keys(td):
    return set(td.keys(include_nested=True, leaves_only=True))


def test_default_promotes_next_and_keeps_other():
    out = step_mdp(make_td())
    assert leaf_keys(out) == {
        "obs",
        "logits",
        "done",
        "terminated",
        "truncated",
        ("agent", "h"),
    }
    assert torch.equal(out["obs"], torch.ones(2, 3))
    assert out["done"].all()  # next value wins over the root value
    assert out.batch_size == (2,)


def test_never_keeps_next_or_reset():
    out = step_mdp(make_td())
    assert "next" not in out and "_reset" not in out


def test_tensors_are_shared_not_copied():
    td = make_td()
    out = step_mdp(td)
    assert out["obs"].data_ptr() == td["next", "obs"].data_ptr()


def test_exclude_flags():
    td = make_td()
    out = step_mdp(td, exclude_reward=False, exclude_action=False, exclude_done=True)
    assert "reward" in out and "action" in out
    assert not {"done", "terminated", "truncated"} & set(out.keys())


def test_keep_other_false():
    out = step_mdp(make_td(), keep_other=False)
    assert "logits" not in out and "action" not in out


def test_keys_restricts_promotion():
    out = step_mdp(make_td(), keep_other=False, keys=["obs", ("agent", "h"), "absent"])
    assert leaf_keys(out) == {"obs", ("agent", "h")}


def test_keys_respects_exclusions():
    out = step_mdp(make_td(), keep_other=False, keys=["obs", "reward"])
    assert leaf_keys(out) == {"obs"}


def test_nested_done_key_in_list():
    td = make_td()
    out = step_mdp(td, keep_other=False, exclude_done=True, done_keys=[("agent", "h")])
    assert ("agent", "h") not in leaf_keys(out) and "done" in out


def test_missing_next_raises():
    with pytest.raises(KeyError, match="expected a 'next' sub-TensorDict"):
        step_mdp(TensorDict({"obs": torch.zeros(2)}, batch_size=[2]))


class TestResetMask:
    def test_shapes(self):
        td = TensorDict({"_reset": torch.tensor([[True], [False]])}, batch_size=[2])
        assert torch.equal(get_reset_mask(td, [2]), torch.tensor([True, False]))
        td = TensorDict({"_reset": torch.tensor([True, False])}, batch_size=[2])
        assert torch.equal(get_reset_mask(td, [2]), torch.tensor([True, False]))
        single = TensorDict({"_reset": torch.tensor([True])}, batch_size=[])
        assert get_reset_mask(single, []).shape == ()

    def test_absent(self):
        assert get_reset_mask(None, [2]) is None
        assert get_reset_mask(TensorDict({}, batch_size=[2]), [2]) is None

    def test_custom_key(self):
        td = TensorDict({("a", "_reset"): torch.ones(2, 1, dtype=torch.bool)}, batch_size=[2])
        assert get_reset_mask(td, [2], reset_key=("a", "_reset")).all()

    def test_repeated_reads_follow_changes(self):
        # The last answer is reused for the same unmodified tensor only.
        raw = torch.tensor([[True], [False]])
        td = TensorDict({"_reset": raw}, batch_size=[2])
        first = get_reset_mask(td, [2])
        assert get_reset_mask(td, [2]) is first
        first[1] = True  # a caller editing the answer does not change the next one
        assert get_reset_mask(td, [2]).tolist() == [True, False]
        assert raw.tolist() == [[True], [False]]  # nor the input
        raw[1] = True  # an in-place edit of the input is seen
        assert get_reset_mask(td, [2]).tolist() == [True, True]
        td["_reset"] = torch.tensor([[False], [False]])  # a new tensor
        assert get_reset_mask(td, [2]).tolist() == [False, False]
        flat = TensorDict({"_reset": torch.tensor([True, False])}, batch_size=[2])
        mask = get_reset_mask(flat, [2])
        mask[0] = False
        assert flat["_reset"].tolist() == [True, False]
        with pytest.raises(ValueError, match="expected a bool tensor"):
            get_reset_mask(TensorDict({"_reset": raw}, batch_size=[]), [])

    def test_bad_shape(self):
        td = TensorDict({"_reset": torch.ones(2, 2, dtype=torch.bool)}, batch_size=[2])
        with pytest.raises(ValueError, match=r"expected a bool tensor of shape \(2, 1\)"):
            get_reset_mask(td, [2])


class TestWhereReset:
    def test_mask(self):
        out = where_reset(torch.tensor([True, False]), torch.zeros(2, 1, 3), torch.ones(2, 1, 3))
        assert torch.equal(out[0], torch.zeros(1, 3)) and torch.equal(out[1], torch.ones(1, 3))

    def test_no_mask_or_current(self):
        new = torch.zeros(2)
        assert where_reset(None, new, torch.ones(2)) is new
        assert where_reset(torch.tensor([False, False]), new, None) is new

    def test_single_env_scalar_mask(self):
        out = where_reset(torch.tensor(True), torch.tensor(0), torch.tensor(3))
        assert out.item() == 0
        assert where_reset(torch.tensor(False), torch.tensor(0), torch.tensor(3)).item() == 3

    def test_inputs_not_modified(self):
        current = torch.ones(2, 3)
        where_reset(torch.tensor([True, False]), torch.zeros(2, 3), current)
        assert torch.equal(current, torch.ones(2, 3))


def test_merge_reset_matches_where_reset_per_key():
    mask = torch.tensor([True, False, True])
    reset = TensorDict(
        {"obs": torch.zeros(3, 2), "h": torch.zeros(3, 1, 4), "only_reset": torch.zeros(3)},
        batch_size=[3],
    )
    current = TensorDict(
        {"obs": torch.ones(3, 2), "h": torch.ones(3, 1, 4), "only_current": torch.ones(3)},
        batch_size=[3],
    )
    expected = {k: where_reset(mask, reset[k], current[k]) for k in ("obs", "h")}
    out = merge_reset(mask, reset, current, ["obs", "h", "only_reset", "only_current"])
    assert out is reset
    for key, value in expected.items():
        assert torch.equal(out[key], value)
    assert torch.equal(out["only_reset"], torch.zeros(3))  # no current value: kept as is
    assert "only_current" not in out
    assert torch.equal(current["obs"], torch.ones(3, 2))  # inputs are not written in place


@pytest.mark.parametrize("seed", range(20))
def test_merge_reset_plain_fast_path_matches_generic_containers(seed):
    # merge_reset reads plain TensorDicts through their dicts; lazy stacks, nested keys and
    # sub-TensorDicts take get: the same values either way, per key as where_reset gives.
    g = torch.Generator().manual_seed(seed)
    batch = [[3], [2, 2], [1]][seed % 3]
    mask = torch.rand(batch, generator=g) < 0.5
    shapes = {"obs": (2,), "done": (1,), "h": (1, 4), "s": ()}
    pool = list(shapes)
    both = [k for k in pool if torch.rand((), generator=g) < 0.7]
    only_reset = [k for k in pool if k not in both and torch.rand((), generator=g) < 0.5]

    def make(keys, fill):
        entries = {k: torch.full((*batch, *shapes[k]), fill) for k in keys}
        entries["sub"] = {"x": torch.full((*batch, 2), fill)}
        return TensorDict(entries, batch_size=batch)

    keys = [*pool, ("sub", "x"), "sub", "missing"]
    for lazy in (False, True):
        reset = make(both + only_reset, float(seed))
        current = make(both, -1.0 - seed)
        if lazy:
            current = torch.stack(current.unbind(0), 0)  # a LazyStackedTensorDict
        before = current.clone()
        out = merge_reset(mask, reset.clone(), current, keys)
        for key in [*both, ("sub", "x")]:
            assert torch.equal(out[key], where_reset(mask, reset[key], current[key]))
        for key in only_reset:
            assert torch.equal(out[key], reset[key])
        assert (current == before).all()  # inputs are not written in place


@pytest.mark.parametrize(
    "values, expected",
    [
        ([False, False], (False, False)),
        ([True, False], (True, False)),
        ([True, True], (True, True)),
    ],
)
def test_reset_mask_any_all(values, expected):
    assert reset_mask_any_all(torch.tensor(values)) == expected


def test_reset_mask_any_all_sees_in_place_changes():
    mask = torch.tensor([False, False])
    assert reset_mask_any_all(mask) == (False, False)
    mask[0] = True  # bumps the version counter: the kept answer is not reused
    assert reset_mask_any_all(mask) == (True, False)
    mask.fill_(True)
    assert reset_mask_any_all(mask) == (True, True)


def test_tensordict_of_checked_equals_the_checked_constructor():
    entries = {"a": torch.zeros(2, 3), "b": {"c": torch.ones(2, 1, dtype=torch.bool)}}
    fast = tensordict_of_checked(entries, torch.Size([2]), torch.device("cpu"))
    slow = TensorDict(entries, batch_size=[2], device="cpu")
    assert fast.batch_size == slow.batch_size and fast.device == slow.device
    assert set(fast.keys(True, True)) == set(slow.keys(True, True))
    assert torch.equal(fast["b", "c"], slow["b", "c"])
    assert fast["b"].batch_size == torch.Size([2])


def _set_next_cases():
    """(root, next) pairs: fitting ones (stored as they are) and ones set must adjust."""
    cpu = torch.device("cpu")
    for device in (None, cpu):
        for batch in ([], [2], [2, 3]):
            yield (
                TensorDict({"a": torch.zeros(*batch, 1)}, batch_size=batch, device=device),
                TensorDict({"b": torch.ones(*batch, 2)}, batch_size=batch, device=device),
            )
    # a longer batch than the root's, no device against a device, dim names on either side
    yield TensorDict({}, [2]), TensorDict({"b": torch.ones(2, 3)}, [2, 3])
    yield TensorDict({}, [2], device=cpu), TensorDict({"b": torch.ones(2)}, [2])
    yield TensorDict({}, [2], names=["env"]), TensorDict({"b": torch.ones(2)}, [2])
    yield TensorDict({}, [2]), TensorDict({"b": torch.ones(2)}, [2], names=["env"])
    yield TensorDict({}, [2]), TensorDict({"b": torch.ones(2, 3)}, [2]).lock_()


@pytest.mark.parametrize("case", range(len(list(_set_next_cases()))))
def test_set_next_equals_set(case):
    root, nxt = list(_set_next_cases())[case]
    fast, slow = root.clone(False), root.clone(False)
    set_next(fast, nxt)
    slow.set("next", nxt)
    a, b = fast.get("next"), slow.get("next")
    assert type(a) is type(b) and a.batch_size == b.batch_size and a.device == b.device
    assert a.names == b.names and fast.names == slow.names
    assert a.is_locked == b.is_locked
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        assert a.get(key) is b.get(key) or torch.equal(a.get(key), b.get(key))


def test_set_next_on_a_locked_root_raises_the_same_error():
    nxt = TensorDict({"b": torch.ones(2)}, [2])
    errors = []
    for write in (set_next, lambda td, value: td.set("next", value)):
        root = TensorDict({}, [2]).lock_()
        with pytest.raises(RuntimeError) as info:
            write(root, nxt)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("seed", range(8))
def test_primed_reset_mask_answers_what_reading_it_would(seed):
    gen = torch.Generator().manual_seed(seed)
    batch = [(3,), (2, 2), (1,)][seed % 3]
    done = torch.rand(batch, generator=gen) < 0.5
    flag = done.unsqueeze(-1)
    td = TensorDict({"_reset": flag}, batch_size=batch)
    prime_reset_mask(flag, done, int(done.sum()))
    primed = get_reset_mask(td, batch)
    assert primed is done
    assert reset_mask_any_all(primed) == (bool(done.any()), bool(done.all()))
    # a write to the mask voids the primed answers: they are read again
    done.fill_(True)
    again = get_reset_mask(td, batch)
    assert bool(again.all()) and reset_mask_any_all(again) == (True, True)


def test_prime_reset_mask_ignores_what_does_not_fit():
    done = torch.tensor([True, False])
    other = TensorDict({"_reset": torch.tensor([[False], [True]])}, batch_size=[2])
    prime_reset_mask(done.float().unsqueeze(-1), done.float(), 1)  # not bool: not primed
    prime_reset_mask(done, done, 1)  # not [*B, 1]: not primed
    assert get_reset_mask(other, [2]).tolist() == [False, True]


def test_update_checked_equals_update():
    base = TensorDict({"a": torch.zeros(2), "sub": {"x": torch.zeros(2)}}, batch_size=[2])
    for update in (
        TensorDict({"a": torch.ones(2), "b": torch.ones(2, 3)}, batch_size=[2]),
        TensorDict({"sub": {"y": torch.ones(2)}}, batch_size=[2]),  # merged, not replaced
        TensorDict({"a": torch.ones(2, 4)}, batch_size=[2, 4]),
    ):
        fast, slow = base.clone(), base.clone()
        update_checked(fast, update)
        slow.update(update)
        assert set(fast.keys(True, True)) == set(slow.keys(True, True))
        for key in slow.keys(True, True):
            assert torch.equal(fast[key], slow[key])


@pytest.mark.parametrize("seed", range(12))
def test_count_true_equals_sum(seed):
    gen = torch.Generator().manual_seed(seed)
    shape = [(), (1,), (1, 1), (8,), (3, 2), (4, 3)][seed % 6]
    mask = torch.rand(shape, generator=gen) < 0.5
    views = [mask]
    if mask.ndim == 2:
        views += [mask.t(), mask[:, ::2]]  # non-contiguous views
    for view in views:
        assert count_true(view) == int(view.sum())
        assert count_true(view.to(torch.int64)) == int(view.sum())  # not bool: sum()
