"""Tests of recurrl.collectors._policy_plan: the lean call gives what the policy gives."""

import sys

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
    set_skip_existing,
)
from torch import nn

import recurrl.collectors.collector as collector_module
from recurrl.collectors import Collector
from recurrl.collectors._policy_plan import plan_policy
from recurrl.modules import GRUModule, LSTMModule, set_recurrent_mode
from recurrl.testing import CountingEnv

B, F, H = 3, 4, 5


def lstm() -> LSTMModule:
    return LSTMModule(
        F, H, in_keys=["observation", "h", "c"], out_keys=["feat", ("next", "h"), ("next", "c")]
    )


def root() -> TensorDict:
    return TensorDict(
        {
            "observation": torch.randn(B, F),
            "h": torch.randn(B, 1, H),
            "c": torch.randn(B, 1, H),
            "is_init": torch.tensor([[True], [False], [False]]),
        },
        batch_size=[B],
    )


def same(policy, td=None) -> TensorDict:
    """Run the policy and its plan on copies of one input; assert equal outputs."""
    td = root() if td is None else td
    plan = plan_policy(policy)
    assert plan is not None
    with torch.no_grad(), set_recurrent_mode(False):
        torch.manual_seed(0)
        expected = policy(td.clone())
        torch.manual_seed(0)
        got = plan(td.clone())
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        assert torch.equal(got[key], expected[key]), key
    return got


def test_usual_policy():
    policy = TensorDictSequential(
        lstm(),
        TensorDictModule(nn.Linear(H, 2), in_keys=["feat"], out_keys=["logits"]),
        TensorDictModule(lambda x: x.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    )
    out = same(policy)
    assert out["action"].shape == (B,)


def test_nested_sequences_and_other_modules_run_as_they_are():
    prob = ProbabilisticTensorDictSequential(
        TensorDictModule(nn.Linear(H, 2), in_keys=["feat"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(
            in_keys=["logits"],
            out_keys=["action"],
            distribution_class=torch.distributions.Categorical,
        ),
    )
    inner = TensorDictSequential(
        TensorDictModule(nn.Tanh(), in_keys=["feat"], out_keys=["feat2"]),
        TensorDictModule(nn.Linear(H, 1), in_keys=["feat2"], out_keys=["value"]),
    )
    same(TensorDictSequential(lstm(), inner, prob))


def test_outputs_written_like_the_wrapper():
    def pair(x):
        return x + 1, x * 2

    def mapping(x):
        return {"b": x * 3, "a": x - 1}

    policy = TensorDictSequential(
        TensorDictModule(pair, in_keys=["observation"], out_keys=["p", ("nested", "q")]),
        TensorDictModule(pair, in_keys=["observation"], out_keys=["_", "kept"]),
        TensorDictModule(mapping, in_keys=["observation"], out_keys=["a", "b"]),
        TensorDictModule(
            lambda x: TensorDict({"y": x}, batch_size=[B]), in_keys=["p"], out_keys=["sub"]
        ),
    )
    out = same(policy)
    assert torch.equal(out["a"], out["observation"] - 1)
    assert "_" not in out
    assert torch.equal(out["sub", "y"], out["p"])


def test_wrappers_with_options_run_through_the_wrapper():
    calls = []
    hooked = TensorDictModule(nn.Linear(F, 2), in_keys=["observation"], out_keys=["hooked"])
    hooked.register_forward_hook(lambda *args: calls.append("hook"))
    by_kwargs = TensorDictModule(
        lambda *, observation: observation * 2,
        in_keys={"observation": "observation"},
        out_keys=["kw"],
    )
    selected = TensorDictModule(
        lambda x: (x, x + 1), in_keys=["observation"], out_keys=["s1", "s2"]
    ).select_out_keys("s2")

    class Sub(TensorDictModule):
        pass

    sub = Sub(lambda x: x - 2, in_keys=["observation"], out_keys=["sub"])
    inner = nn.Linear(F, 2)  # a plain wrapper around a hooked network
    inner.register_forward_hook(lambda *args: calls.append("inner"))
    wrapped = TensorDictModule(inner, in_keys=["observation"], out_keys=["inner"])
    policy = TensorDictSequential(hooked, by_kwargs, selected, sub, wrapped)
    same(policy)
    assert calls == ["hook", "inner", "hook", "inner"]  # the policy's call and the plan's


def _planned_steps(policy: TensorDictSequential) -> list:
    cells = [c.cell_contents for c in plan_policy(policy).__closure__]
    (steps,) = [c for c in cells if isinstance(c, list)]
    return steps


def test_recurrent_modules_called_through_forward_unless_hooked_or_call_overridden():
    plain = lstm()
    assert _planned_steps(TensorDictSequential(plain)) == [plain.forward]  # no Module.__call__
    gru = GRUModule(F, H, in_keys=["observation", "g"], out_keys=["feat3", ("next", "g")])
    assert _planned_steps(TensorDictSequential(gru)) == [gru.forward]

    calls = []
    hooked = lstm()
    hooked.register_forward_hook(lambda *args: calls.append("hook"))

    class Sub(LSTMModule):  # another cell's module: its call is still the base's
        pass

    class OwnForward(LSTMModule):
        def forward(self, tensordict=None, *args, **kwargs):
            calls.append("forward")
            return super().forward(tensordict, *args, **kwargs)

    class OwnCall(LSTMModule):
        def __call__(self, *args, **kwargs):
            calls.append("call")
            return super().__call__(*args, **kwargs)

    def make(cls, out):
        return cls(
            F, H, in_keys=["observation", "h", "c"], out_keys=[out, ("next", "h"), ("next", "c")]
        )

    sub, own_forward, own_call = make(Sub, "feat2"), make(OwnForward, "f4"), make(OwnCall, "f5")
    policy = TensorDictSequential(plain, hooked, sub, own_forward, own_call)
    steps = _planned_steps(policy)
    assert steps[0] == plain.forward and steps[2] == sub.forward
    assert steps[1] is hooked and steps[3] is own_forward and steps[4] is own_call
    same(policy)
    # the policy's call and the plan's, each through the hook and both overrides
    assert calls == ["hook", "forward", "call", "hook", "forward", "call"]


def test_planned_recurrent_module_follows_the_recurrent_mode():
    module = lstm()
    plan = plan_policy(TensorDictSequential(module))
    data = TensorDict(
        {
            "observation": torch.randn(B, 6, F),
            "h": torch.zeros(B, 6, 1, H),
            "c": torch.zeros(B, 6, 1, H),
            "is_init": torch.zeros(B, 6, 1, dtype=torch.bool),
        },
        batch_size=[B, 6],
    )
    with torch.no_grad(), set_recurrent_mode(True):
        got = plan(data.clone())
        expected = module(data.clone())
    assert torch.equal(got["feat"], expected["feat"])


def test_missing_input_raises_like_the_wrapper():
    policy = TensorDictSequential(
        TensorDictModule(nn.Linear(F, 2), in_keys=["absent"], out_keys=["y"])
    )
    plan = plan_policy(policy)
    with pytest.raises(KeyError, match="absent"):
        plan(root())


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes")
def test_failure_names_the_module():
    def boom(x):
        raise RuntimeError("boom")

    policy = TensorDictSequential(
        TensorDictModule(nn.Identity(), in_keys=["observation"], out_keys=["o"]),
        TensorDictModule(boom, in_keys=["o"], out_keys=["y"]),
    )
    with pytest.raises(RuntimeError, match="boom") as info:
        plan_policy(policy)(root())
    assert any("module '1'" in note for note in info.value.__notes__)


def test_no_plan_when_it_would_change_the_call():
    linear = TensorDictModule(nn.Linear(F, 2), in_keys=["observation"], out_keys=["y"])
    assert plan_policy(linear) is None  # not a sequence: called as it is
    assert plan_policy(lambda td: td) is None
    selected = TensorDictSequential(linear, selected_out_keys=["y"])
    assert plan_policy(selected) is None
    copying = TensorDictSequential(linear, inplace=False)
    assert plan_policy(copying) is None
    hooked = TensorDictSequential(linear)
    hooked.register_forward_pre_hook(lambda *args: None)
    assert plan_policy(hooked) is None
    plain = TensorDictSequential(linear)
    assert plan_policy(plain) is not None
    with set_skip_existing(True):
        assert plan_policy(plain) is None
    handle = nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert plan_policy(plain) is None
    finally:
        handle.remove()
    assert plan_policy(plain) is not None


def test_collector_batches_equal_without_the_plan(monkeypatch):
    def make():
        torch.manual_seed(0)
        module = LSTMModule(
            3, H, in_keys=["observation", "h", "c"], out_keys=["feat", ("next", "h"), ("next", "c")]
        )
        policy = TensorDictSequential(
            module,
            TensorDictModule(nn.Linear(H, 2), in_keys=["feat"], out_keys=["logits"]),
            TensorDictModule(lambda x: x.argmax(-1), in_keys=["logits"], out_keys=["action"]),
        )
        env = CountingEnv(batch_size=(2,), max_steps=4)
        return Collector(env, policy, frames_per_batch=12, total_frames=24)

    planned = list(make())
    monkeypatch.setattr(collector_module, "plan_policy", lambda policy: None)
    unplanned = list(make())
    for a, b in zip(planned, unplanned, strict=True):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("layout", ["plain", "device", "names", "lazy", "nested_keys"])
def test_wrapper_reads_and_writes_on_any_tensordict(layout):
    """Plain-string keys of a plain TensorDict are read from its dict and written with
    _set_str; other TensorDicts and keys go through get / set: the same result either way,
    and the same error on a locked TensorDict."""
    keys = ("feat", "logits") if layout != "nested_keys" else (("a", "feat"), ("a", "logits"))
    policy = TensorDictSequential(
        TensorDictModule(nn.Linear(F, H), in_keys=["observation"], out_keys=[keys[0]]),
        TensorDictModule(nn.Linear(H, 2), in_keys=[keys[0]], out_keys=[keys[1]]),
    )
    td = root()
    if layout == "device":
        td = td.to("cpu")
    elif layout == "names":
        td.names = ["env"]
    elif layout == "lazy":
        td = LazyStackedTensorDict.lazy_stack(list(td.unbind(0)), 0)
    got = same(policy, td)
    assert type(got) is type(td) and got.names == td.names and got.device == td.device
    if layout != "lazy":
        errors = []
        for run in (policy, plan_policy(policy)):
            with pytest.raises(RuntimeError) as info, torch.no_grad():
                run(td.clone().lock_())
            errors.append(str(info.value))
        assert errors[0] == errors[1]
