"""recurrl inside TorchRL pipelines, and TorchRL objects given to recurrl.

recurrl's recurrent modules (every built-in memory) step in a TorchRL env with TorchRL's
``InitTracker`` and primers (converted with ``to_torchrl()``), are collected by TorchRL's
collector, replayed from a TorchRL ``ReplayBuffer`` with its ``SliceSampler``, and trained by a
TorchRL loss, which drives them in recurrent mode through TorchRL's own ``set_recurrent_mode``.
Each replay must reproduce the collected per-step outputs. The other way round, a TorchRL env
given to recurrl's ``Collector`` is refused at construction, naming the fix.

Run by ``.ci/torchrl`` (a venv with torchrl 0.14.1 and the lowest supported tensordict).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

torchrl = pytest.importorskip(
    "torchrl", reason="the TorchRL interop tests need torchrl: pip install 'recurrl[torchrl]'"
)

import torch  # noqa: E402
from tensordict.nn import TensorDictModule as Mod  # noqa: E402
from tensordict.nn import TensorDictSequential as Seq  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.collectors import Collector as TorchRLCollector  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    ReplayBuffer,
    SliceSampler,
    TensorDictReplayBuffer,
)
from torchrl.envs import GymEnv as TorchRLGymEnv  # noqa: E402
from torchrl.envs import TransformedEnv as TorchRLTransformedEnv  # noqa: E402
from torchrl.modules import ProbabilisticActor  # noqa: E402
from torchrl.modules import set_recurrent_mode as torchrl_set_recurrent_mode  # noqa: E402
from torchrl.objectives import ClipPPOLoss  # noqa: E402

from recurrl.collectors import Collector  # noqa: E402
from recurrl.envs import GymEnv  # noqa: E402
from recurrl.envs.specs import Bounded, Categorical, Unbounded  # noqa: E402
from recurrl.envs.transforms import (  # noqa: E402
    Compose,
    InitTracker,
    RewardSum,
    TensorDictPrimer,
)
from recurrl.modules import (  # noqa: E402
    GRUModule,
    LRUModule,
    LSTMModule,
    MinGRUModule,
    get_env_transforms_from_module,
    recurrent_mode,
    set_recurrent_mode,
)

CELLS = {"lstm": LSTMModule, "gru": GRUModule, "mingru": MinGRUModule, "lru": LRUModule}
H = 8
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "torchrl.md"


def _actor(cell: str):
    """memory -> linear -> categorical action; the memory is returned too."""
    torch.manual_seed(0)
    memory = CELLS[cell](input_size=4, hidden_size=H, in_key="observation", out_key="features")
    head = Mod(nn.Linear(H, 2), in_keys=["features"], out_keys=["logits"])
    actor = ProbabilisticActor(
        Seq(memory, head),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    return memory, actor


def _torchrl_env(actor):
    base = TorchRLGymEnv("CartPole-v1", categorical_action_encoding=True)
    env = TorchRLTransformedEnv(base, get_env_transforms_from_module(actor).to_torchrl())
    env.set_seed(0)
    return env


def _collect(env, actor, frames: int = 64):
    # the transforms are in the env already; TorchRL's own detection would take the recurrl
    # primer that make_tensordict_primer() returns for a missing TorchRL one (see below)
    collector = TorchRLCollector(
        env, actor, frames_per_batch=frames, total_frames=frames,
        auto_register_policy_transforms=False,
    )  # fmt: skip
    batch = next(iter(collector))
    collector.shutdown()
    return batch


# --- to_torchrl() ---------------------------------------------------------------------------
def test_init_tracker_to_torchrl_writes_the_same_key():
    converted = InitTracker(init_key="first").to_torchrl()
    assert isinstance(converted, torchrl.envs.InitTracker)
    assert converted.init_key == "first"


def test_primer_to_torchrl_keeps_keys_specs_and_values():
    primer = TensorDictPrimer(
        {"rs_h": Unbounded((2, 3)), ("nested", "flag"): Categorical(2, (1,), dtype=torch.bool),
         "bounded": Bounded(-1.0, 1.0, shape=(2,))},
        default_value={"rs_h": 0.5, ("nested", "flag"): 0.0, "bounded": -1.0},
        expand_specs=True,
    )  # fmt: skip
    converted = primer.to_torchrl()
    assert isinstance(converted, torchrl.envs.TensorDictPrimer)
    specs = converted.primers
    assert set(specs.keys(True, True)) == {"rs_h", ("nested", "flag"), "bounded"}
    assert isinstance(specs["rs_h"], torchrl.data.Unbounded)
    assert (specs["rs_h"].shape, specs["rs_h"].dtype) == (torch.Size([2, 3]), torch.float32)
    assert isinstance(specs["nested", "flag"], torchrl.data.Categorical)
    assert specs["nested", "flag"].dtype == torch.bool
    assert (specs["bounded"].space.low == -1).all() and (specs["bounded"].space.high == 1).all()
    assert converted.expand_specs is True
    # in a TorchRL env, on reset: the same initial values as the recurrl primer writes
    env = TorchRLTransformedEnv(TorchRLGymEnv("CartPole-v1"), converted)
    td = env.reset()
    assert (td["rs_h"] == 0.5).all() and td["rs_h"].shape == (2, 3)
    assert (td["bounded"] == -1).all() and not td["nested", "flag"].any()


def test_random_primer_converts_to_a_random_torchrl_primer():
    converted = TensorDictPrimer(rs_h=Unbounded((1, 4)), random=True).to_torchrl()
    assert converted.random


def test_a_callable_default_value_is_refused_by_name():
    primer = TensorDictPrimer(rs_h=Unbounded((1, 4)), default_value=lambda: torch.ones(1, 4))
    with pytest.raises(ValueError, match=r"callable default_value.*Fix: build"):
        primer.to_torchrl()


def test_compose_to_torchrl_converts_every_transform_in_order():
    composed = Compose(InitTracker(), TensorDictPrimer(rs_h=Unbounded((1, 4))))
    converted = composed.to_torchrl()
    assert isinstance(converted, torchrl.envs.Compose)
    assert [type(t) for t in converted] == [
        torchrl.envs.InitTracker,
        torchrl.envs.TensorDictPrimer,
    ]


def test_a_transform_without_conversion_says_so():
    with pytest.raises(NotImplementedError, match=r"RewardSum\.to_torchrl: no TorchRL conversion"):
        RewardSum().to_torchrl()


@pytest.mark.parametrize("cell", CELLS)
def test_module_primers_convert_for_every_memory(cell):
    memory, actor = _actor(cell)
    primer = memory.make_tensordict_primer().to_torchrl()
    assert isinstance(primer, torchrl.envs.TensorDictPrimer)
    expected = {k: shape for k, (shape, _) in memory.recurrent_state_spec.items()}
    assert {k: primer.primers[k].shape for k in expected} == expected
    transforms = get_env_transforms_from_module(actor).to_torchrl()
    assert [type(t) for t in transforms] == [
        torchrl.envs.InitTracker,
        torchrl.envs.TensorDictPrimer,
    ]


def test_a_recurrl_transform_in_a_torchrl_env_fails_naming_to_torchrl():
    # TorchRL wraps any callable it is given as a transform, and calls it at reset
    env = TorchRLGymEnv("CartPole-v1").append_transform(InitTracker())
    with pytest.raises(ValueError, match=r"to_torchrl\(\)"):
        env.reset()


def test_importing_recurrl_does_not_import_torchrl():
    code = (
        "import sys, recurrl, recurrl.modules, recurrl.envs, recurrl.data, recurrl.collectors, "
        "recurrl.objectives\n"
        "from recurrl.envs import InitTracker\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'torchrl'], 'imported'\n"
        "InitTracker().to_torchrl()\n"
        "assert 'torchrl' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


# --- recurrent mode: TorchRL's switch reaches recurrl's modules ----------------------------------
def test_torchrl_set_recurrent_mode_reaches_recurrl():
    memory, _ = _actor("lstm")
    assert recurrent_mode() is False and memory.recurrent_mode is False
    with torchrl_set_recurrent_mode(True):
        assert recurrent_mode() is True and memory.recurrent_mode is True
        with set_recurrent_mode(False):  # an open recurrl block wins
            assert memory.recurrent_mode is False
        with torchrl_set_recurrent_mode(False):
            assert memory.recurrent_mode is False
    assert memory.recurrent_mode is False


# --- the pipeline: TorchRL env, collector, replay buffer, loss -------------------------------
@pytest.fixture(scope="module", params=list(CELLS))
def collected(request):
    memory, actor = _actor(request.param)
    env = _torchrl_env(actor)
    batch = _collect(env, actor)
    env.close()
    return memory, actor, batch


def test_the_collector_carries_the_hidden_state(collected):
    memory, actor, batch = collected
    assert batch["is_init"].sum() >= 2, "expected several episodes in the batch"
    # one recurrent pass over the collected steps (restarting at every is_init from the zeros
    # the primer stored) reproduces every collected output: the state rode from step to step
    with set_recurrent_mode(True):
        replay = actor(batch.exclude("logits", "features", "action").unsqueeze(0).clone())
    torch.testing.assert_close(replay["logits"][0], batch["logits"], atol=1e-5, rtol=1e-5)
    # and it used it: outputs from a zero state at every step differ
    zeros = batch.exclude("logits", "features").clone()
    for key in memory.state_keys:
        zeros[key] = torch.zeros_like(zeros[key])
    zeros["is_init"] = torch.ones_like(zeros["is_init"])
    assert not torch.allclose(actor(zeros)["logits"], batch["logits"], atol=1e-3)


def _slices(batch, buffer_cls=TensorDictReplayBuffer, slice_len: int = 8, num_slices: int = 6):
    buffer = buffer_cls(
        storage=LazyTensorStorage(batch.numel()),
        sampler=SliceSampler(slice_len=slice_len, traj_key=("collector", "traj_ids")),
        batch_size=slice_len * num_slices,
    )
    buffer.extend(batch)
    torch.manual_seed(1)
    return buffer.sample().reshape(num_slices, slice_len)


def _with_later_states_scrambled(sample, memory):
    """Stored states after each slice's first step replaced by noise: recurrent mode never
    reads them (it starts from the first step's state and carries it), one-step evaluation
    reads every one."""
    out = sample.clone()
    for key in memory.state_keys:
        noisy = out[key].clone()
        noisy[:, 1:] = torch.randn_like(noisy[:, 1:])
        out[key] = noisy
    return out


@pytest.mark.parametrize("buffer_cls", [ReplayBuffer, TensorDictReplayBuffer])
def test_slices_replayed_under_torchrl_recurrent_mode_match_collection(collected, buffer_cls):
    memory, actor, batch = collected
    sample = _slices(batch, buffer_cls)
    # TensorDictReplayBuffer marks every slice start is_init (the sampler's info), ReplayBuffer
    # returns the stored flags: recurrent mode starts each row from its stored state either way
    marked = sample["is_init"][:, 0].all()
    assert marked if buffer_cls is TensorDictReplayBuffer else not marked
    scrambled = _with_later_states_scrambled(sample, memory)
    with torchrl_set_recurrent_mode(True):
        replay = actor(scrambled.exclude("logits", "features").clone())
    torch.testing.assert_close(replay["logits"], sample["logits"], atol=1e-5, rtol=1e-5)
    # one step at a time (what a silently ignored switch would do) is wrong here
    stepped = actor(scrambled.exclude("logits", "features").clone())
    assert not torch.allclose(stepped["logits"], sample["logits"], atol=1e-3)


def test_a_torchrl_loss_runs_recurrl_memories_in_recurrent_mode(collected):
    memory, actor, batch = collected
    critic = Mod(nn.Linear(4, 1), in_keys=["observation"], out_keys=["state_value"])
    loss = ClipPPOLoss(actor, critic)
    sample = _with_later_states_scrambled(_slices(batch), memory)
    sample["advantage"] = torch.randn(*sample.shape, 1)
    sample["value_target"] = torch.randn(*sample.shape, 1)
    modes = []
    hook = memory.register_forward_pre_hook(lambda m, args: modes.append(m.recurrent_mode))
    try:
        out = loss(sample.exclude("logits", "features").clone())
    finally:
        hook.remove()
    assert modes and all(modes)
    # the policy replayed in the loss is the one that acted: ratio 1 at every step
    assert abs(out["kl_approx"].item()) < 1e-5
    assert out["clip_fraction"].item() == 0
    total = out["loss_objective"] + out["loss_critic"]
    total.backward()
    assert all(p.grad is not None for p in memory.parameters())


def test_torchrl_auto_registration_of_a_recurrl_primer_fails_loudly():
    # TorchRL's collector asks the policy's modules for make_tensordict_primer(); a recurrl
    # module returns recurrl's primer, which TorchRL does not recognise: with
    # auto_register_policy_transforms=True it appends it, and the first reset names the fix
    _, actor = _actor("gru")
    env = TorchRLTransformedEnv(TorchRLGymEnv("CartPole-v1", categorical_action_encoding=True))
    with pytest.raises(ValueError, match=r"to_torchrl\(\)"):
        collector = TorchRLCollector(
            env, actor, frames_per_batch=8, total_frames=8, auto_register_policy_transforms=True
        )
        next(iter(collector))


# --- the other way: TorchRL envs given to recurrl ---------------------------------------------
def test_recurrl_collector_refuses_a_torchrl_env_naming_the_fix():
    _, actor = _actor("lstm")
    env = TorchRLGymEnv("CartPole-v1")
    with pytest.raises(TypeError, match=r"TorchRL env .*recurrl.envs.GymEnv.*Collector"):
        Collector(env, actor, frames_per_batch=8)
    with pytest.raises(TypeError, match=r"factory's result.*TorchRL env"):
        Collector(lambda: env, actor, frames_per_batch=8)
    env.close()


def test_the_fix_named_by_the_refusal_works():
    # the same task built with recurrl: the same memory collects there as is
    memory = LSTMModule(input_size=4, hidden_size=H, in_key="observation", out_key="features")
    head = Mod(nn.Linear(H, 2), in_keys=["features"], out_keys=["logits"])
    act = Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"])
    collector = Collector(GymEnv("CartPole-v1"), Seq(memory, head, act), frames_per_batch=8)
    batch = next(iter(collector))
    collector.shutdown()
    assert batch["is_init"].shape == (8, 1) and ("next", "recurrent_state_h") in batch.keys(True)


# --- the guide's example ---------------------------------------------------------------------
def test_the_guide_example_runs():
    text = GUIDE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks, f"no python example in {GUIDE}"
    namespace: dict = {}
    exec(compile(blocks[0], str(GUIDE), "exec"), namespace)  # asserts inside the example
