"""Tests of recurrl.modules.transformer (TransformerModule) and its network
(recurrl.modules.nets.transformer.GatedTransformer).

The oracle of recurrent mode is the module itself in sequential mode, one step per call with
the state threaded by hand (``tests/modules/_reference.py``): outputs, next states at
trajectory ends and gradients must agree on random restarts, memory lengths 1..T+2 and 1-3
layers. Then: NaN isolation, the module under the Collector (the shared collector contract),
replay from stored memories and its recomputation by burn-in, and the trainer's
``--memory transformer``.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.envs import make_torch_env
from recurrl.modules import (
    MEMORY_REGISTRY,
    TransformerModule,
    get_primers_from_module,
    set_recurrent_mode,
)
from recurrl.modules.nets import GatedTransformer
from recurrl.modules.nets.transformer import _next_memory, _rotary, _zeros
from tests.collectors._contract import check_collector_contract
from tests.collectors.test_collector import STATE_KEYS
from tests.modules._reference import (
    random_is_init,
    run_recurrent,
    sequence_td,
    step_loop,
    trajectory_end_mask,
)

F_IN, H, T = 3, 8, 7
MEM_KEY, COUNT_KEY = "recurrent_state_memory", "recurrent_state_count"


def make(memory_length: int = 4, num_layers: int = 1, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    return TransformerModule(
        F_IN, H, num_layers=num_layers, memory_length=memory_length, in_key="x", out_key="y",
        **kwargs,
    )  # fmt: skip


def random_state(module: TransformerModule, *batch: int) -> list[torch.Tensor]:
    """A non-empty stored memory: noisy slots and random valid counts ``0..M``."""
    m, layers = module.memory_length, module.config.num_layers
    memory = torch.randn(*batch, layers, m * H)
    count = torch.randint(0, m + 1, (*batch, layers, 1)).float()
    return [memory, count]


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-4)


# --- the oracle: recurrent mode == sequential steps ---------------------------------------
def _loss(y, nexts, ends, weights):
    """A scalar reading the outputs and the next states at trajectory ends."""
    total = (y * weights[0]).sum()
    for state, w in zip(nexts, weights[1:], strict=True):
        total = total + (torch.where(ends[..., None, None], state, 0.0) * w).sum()
    return total


@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("memory_length", range(1, T + 3))
def test_recurrent_mode_matches_sequential_steps(memory_length, num_layers):
    module = make(memory_length, num_layers, seed=memory_length * 10 + num_layers)
    batch = (4,)
    torch.manual_seed(memory_length + 100 * num_layers)
    x = torch.randn(*batch, T, F_IN, requires_grad=True)
    is_init = random_is_init((*batch, T), p=0.3)
    is_init[0] = False  # one row without restart
    is_init[1, 0] = True
    init = random_state(module, *batch)
    ref = step_loop(module, x, is_init, init)
    stored = [s.detach() for s in ref["stored"]]  # what a collector stores: no graph
    td = run_recurrent(module, sequence_td(module, x, is_init, stored))
    ends = trajectory_end_mask(is_init)
    close(td["y"], ref["y"])
    for key, expected in zip(module.state_keys, ref["next"], strict=True):
        close(td["next", key][ends], expected[ends])
        assert td["next", key][~ends].abs().max() == 0  # zeros off the trajectory ends

    # gradients w.r.t. the parameters and the inputs, through outputs and next states
    weights = [torch.randn_like(td["y"]), *(torch.randn_like(s) for s in ref["next"])]
    params = [x, *module.parameters()]
    nexts = [td["next", k] for k in module.state_keys]
    got = torch.autograd.grad(_loss(td["y"], nexts, ends, weights), params)
    want = torch.autograd.grad(_loss(ref["y"], ref["next"], ends, weights), params)
    for g, w in zip(got, want, strict=True):
        close(g, w, atol=2e-5)


@pytest.mark.parametrize("memory_length", [1, 5, 16, 23])
def test_long_sequences_run_in_blocks(memory_length):
    """T > 16 steps: recurrent mode splits the queries into blocks of max(M, 16) (padded),
    each attending to its window of M + block keys; still the sequential steps."""
    module = make(memory_length, 2, seed=memory_length)
    steps = 41
    x = torch.randn(3, steps, F_IN, requires_grad=True)
    is_init = random_is_init((3, steps), p=0.08)
    is_init[0] = False
    init = random_state(module, 3)
    ref = step_loop(module, x, is_init, init)
    td = run_recurrent(module, sequence_td(module, x, is_init, [s.detach() for s in ref["stored"]]))
    ends = trajectory_end_mask(is_init)
    close(td["y"], ref["y"])
    for key, expected in zip(module.state_keys, ref["next"], strict=True):
        close(td["next", key][ends], expected[ends])
    (got,) = torch.autograd.grad(td["y"].square().sum(), x)
    (want,) = torch.autograd.grad(ref["y"].square().sum(), x)
    close(got, want, atol=2e-5)


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)], ids=["T", "BT", "B1B2T"])
def test_batch_dims_and_gradient_to_the_stored_memory(batch):
    module = make(3, 2)
    torch.manual_seed(1)
    x = torch.randn(*batch, T, F_IN)
    is_init = random_is_init((*batch, T), p=0.25, first=False)
    memory, count = random_state(module, *batch)
    memory.requires_grad_(True)
    ref = step_loop(module, x, is_init, [memory, count])
    td = run_recurrent(module, sequence_td(module, x, is_init, ref["stored"]))
    close(td["y"], ref["y"])
    # the stored memory at t = 0 is read by both (is_init False there), with its graph
    (g_seq,) = torch.autograd.grad(td["y"].sum(), memory, retain_graph=True)
    (g_ref,) = torch.autograd.grad(ref["y"].sum(), memory)
    close(g_seq, g_ref)
    assert g_ref.abs().sum() > 0


def test_restart_from_a_non_empty_stored_memory_inside_a_row():
    """An is_init inside a row whose stored memory is not empty (a burn-in restart, a slice
    glued mid-row) starts from that memory, as every recurrent module does."""
    module = make(3, 2)
    torch.manual_seed(2)
    n = 3
    x = torch.randn(n, T, F_IN)
    is_init = torch.zeros(n, T, dtype=torch.bool)
    is_init[0, 3] = is_init[1, 2] = is_init[1, 5] = True
    stored = [torch.zeros(n, T, *s.shape[1:]) for s in random_state(module, n)]
    for row, t in ((0, 0), (0, 3), (1, 0), (1, 5), (2, 0)):  # non-empty memories
        stored[0][row, t], stored[1][row, t] = (s[0] for s in random_state(module, 1))
    stored[1][0, 3] = 2.0
    # the reference: each piece run step by step from its stored memory
    y = torch.empty(n, T, H)
    pieces = [(0, 0, 3), (0, 3, T), (1, 0, 2), (1, 2, 5), (1, 5, T), (2, 0, T)]
    for row, a, b in pieces:
        ref = step_loop(module, x[row, a:b], torch.zeros(b - a, dtype=torch.bool),
                        [s[row, a] for s in stored])  # fmt: skip
        y[row, a:b] = ref["y"]
    td = run_recurrent(module, sequence_td(module, x, is_init, stored))
    close(td["y"], y)


def test_positions_are_relative():
    """Rotary positions: a memory filled by steps scores as those steps in the sequence, so
    one pass over 2T steps equals T steps and then T steps from the stored memory."""
    module = make(5, 2)
    x = torch.randn(2, 2 * T, F_IN)
    is_init = torch.zeros(2, 2 * T, dtype=torch.bool)
    empty = [torch.zeros(2, 2 * T, *s.shape[1:]) for s in random_state(module, 2)]
    whole = run_recurrent(module, sequence_td(module, x, is_init, empty))
    first = run_recurrent(module, sequence_td(module, x[:, :T], is_init[:, :T],
                                              [s[:, :T] for s in empty]))  # fmt: skip
    carried = [first["next", k][:, -1:].expand(2, T, *first["next", k].shape[2:])
               for k in module.state_keys]  # fmt: skip
    second = run_recurrent(module, sequence_td(module, x[:, T:], is_init[:, T:], carried))
    close(second["y"], whole["y"][:, T:])
    assert first["next", COUNT_KEY][:, -1].eq(5).all()


@pytest.mark.parametrize("steps", [1, 5, 40])
def test_next_memory_sparse_and_dense_paths_agree(steps):
    """The next memory gathered at the trajectory ends only (CPU, written into a memory map
    above 1 MiB) equals the branchless gather of every step, values and gradients."""
    torch.manual_seed(steps)
    n, layers, m, size = 3, 2, 4, 5
    stacked = torch.randn(n, layers, m + steps, size, requires_grad=True)
    ends = torch.rand(n, steps) < 0.3
    ends[:, -1] = True
    keep_from = torch.randint(0, m + steps, (n, steps))
    sparse = _next_memory(stacked, ends, keep_from, sparse=True)
    dense = _next_memory(stacked, ends, keep_from, sparse=False)
    assert sparse.shape == (n, steps, layers, m, size)
    assert torch.equal(sparse, dense) and dense[~ends].abs().sum() == 0
    w = torch.randn_like(dense)
    (g_sparse,) = torch.autograd.grad((sparse * w).sum(), stacked)
    (g_dense,) = torch.autograd.grad((dense * w).sum(), stacked)
    assert torch.equal(g_sparse, g_dense)


def test_untouched_zeros_are_zeros_and_own_their_memory():
    like = torch.ones(1, dtype=torch.float64)
    big = _zeros((300, 1000), like)  # 2.4 MB: a memory map
    small = _zeros((3, 4), like)
    assert big.dtype == small.dtype == torch.float64 and big.shape == (300, 1000)
    assert big.abs().sum() == 0 and small.abs().sum() == 0
    big[7, 3] = 2.0
    assert big.sum() == 2.0
    copies = [_zeros((300, 1000), like) for _ in range(3)]  # each its own memory
    copies[0].fill_(1.0)
    assert copies[1].abs().sum() == 0 and copies[2].abs().sum() == 0


def test_rotary_tables_are_cached_slices_usable_after_inference_mode():
    """The cached tables hold the values built for exactly that many positions; a table
    first built while acting (inference mode) serves a training pass with gradients."""
    net = GatedTransformer(F_IN, H, memory_length=3)
    d = H // net.num_heads
    with torch.inference_mode():
        cos, sin = net._rope(5, torch.zeros(1))
    want = _rotary(torch.arange(5), d, torch.float32)
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])
    assert torch.equal(net._rope(300, torch.zeros(1))[0][:5], want[0])  # grown, same values
    x = torch.randn(2, 4, F_IN, requires_grad=True)
    memory, count = torch.zeros(2, 1, 3, H), torch.zeros(2, 1, dtype=torch.long)
    is_init = torch.zeros(2, 4, dtype=torch.bool)
    y, _, _ = net.sequence(x, memory[:, None].expand(2, 4, 1, 3, H),
                           count[:, None].expand(2, 4, 1), is_init)  # fmt: skip
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.isfinite(g).all()


def test_gates_start_near_the_identity():
    """GTrXL's initialisation: the update gate z = sigmoid(W_z y + U_z x - b_g) starts near
    sigmoid(-2) = 0.12, so each layer starts close to passing its input through."""
    torch.manual_seed(0)
    gate = GatedTransformer(F_IN, 64).layers[0].gate_attn
    x, y = torch.randn(256, 64), torch.randn(256, 64).relu()
    _, wz, _ = gate.w(y).chunk(3, dim=-1)
    _, uz = gate.u(x).chunk(2, dim=-1)
    z = torch.sigmoid(wz + uz - gate.gate_bias)
    assert gate.gate_bias == 2.0 and 0.08 < z.mean() < 0.2
    out = gate(x, y)
    assert (out - x).norm() < 0.5 * x.norm()


# --- resets by selection: NaN isolation ----------------------------------------------------
def test_sequential_reset_selects_an_empty_memory_even_over_nan():
    module = make(3, 2)
    x = torch.randn(4, F_IN)
    init = torch.ones(4, 1, dtype=torch.bool)
    poisoned = TensorDict({"x": x, "is_init": init, MEM_KEY: torch.full((4, 2, 3 * H), torch.nan),
                           COUNT_KEY: torch.full((4, 2, 1), torch.nan)}, [4])  # fmt: skip
    clean = TensorDict({"x": x, "is_init": init}, [4])
    module(poisoned)
    module(clean)
    assert torch.isfinite(poisoned["y"]).all()
    torch.testing.assert_close(poisoned["y"], clean["y"], rtol=0, atol=0)
    torch.testing.assert_close(poisoned["next", MEM_KEY], clean["next", MEM_KEY], rtol=0, atol=0)


def test_sequential_invalid_slots_are_ignored():
    """Slots outside the last ``count`` are never read (NaN there changes nothing)."""
    module = make(4, 1)
    x = torch.randn(2, F_IN)
    memory = torch.randn(2, 1, 4, H)
    count = torch.tensor([[[1.0]], [[3.0]]])
    noisy = memory.clone()
    noisy[0, 0, :3] = torch.nan
    noisy[1, 0, :1] = torch.nan
    outs = []
    for mem in (memory, noisy):
        td = TensorDict({"x": x, "is_init": torch.zeros(2, 1, dtype=torch.bool),
                         MEM_KEY: mem.reshape(2, 1, 4 * H), COUNT_KEY: count}, [2])  # fmt: skip
        outs.append(module(td)["y"])
    assert torch.isfinite(outs[1]).all()
    close(outs[1], outs[0])


def test_recurrent_nan_in_a_finished_episode_never_reaches_the_next():
    module = make(4, 2)
    torch.manual_seed(3)
    x = torch.randn(2, T, F_IN)
    is_init = torch.zeros(2, T, dtype=torch.bool)
    is_init[:, 3] = True
    stored = [torch.zeros(2, T, *s.shape[1:]) for s in random_state(module, 2)]
    clean = run_recurrent(module, sequence_td(module, x, is_init, stored))
    dirty_x = x.clone()
    dirty_x[:, 1] = torch.nan  # inside the first episode (steps 0-2)
    dirty_stored = [s.clone() for s in stored]
    dirty_stored[0][:, 3] = torch.nan  # garbage in the empty memory of the restart
    dirty = run_recurrent(module, sequence_td(module, dirty_x, is_init, dirty_stored))
    # the episode that holds the NaN: NaN from it on, as step by step (it sees the NaN)
    assert torch.isnan(dirty["y"][:, 1:3]).all()
    close(dirty["y"][:, :1], clean["y"][:, :1])
    assert torch.isfinite(dirty["y"][:, 3:]).all()
    close(dirty["y"][:, 3:], clean["y"][:, 3:])
    close(dirty["next", MEM_KEY][:, -1], clean["next", MEM_KEY][:, -1])
    # and the same in sequential mode, step by step
    ref = step_loop(module, dirty_x, is_init, [s[:, 0] for s in stored])
    assert torch.isnan(ref["y"][:, 1:3]).all()
    close(ref["y"][:, 3:], dirty["y"][:, 3:])


# --- construction, keys, specs, errors -----------------------------------------------------
def test_state_spec_primer_and_keys():
    import recurrl.envs  # noqa: F401  (registers the primer builders)

    module = TransformerModule(5, 16, num_layers=2, memory_length=6, in_keys=["o", "m", "c"],
                               out_keys=["f", ("next", "m"), ("next", "c")])  # fmt: skip
    assert module.in_keys == ["o", "m", "c", "is_init"]
    spec = module.recurrent_state_spec
    assert {k: tuple(s) for k, (s, _) in spec.items()} == {"m": (2, 6 * 16), "c": (2, 1)}
    primer = get_primers_from_module(module)
    assert sorted(primer.primers.keys()) == ["c", "m"]
    assert module.rnn.num_heads == 4 and module.recurrent_backend == "auto"
    assert module.python_based


def test_missing_state_reads_as_empty_memory_at_episode_starts_only():
    module = make(3)
    out = module(TensorDict({"x": torch.randn(2, F_IN),
                             "is_init": torch.ones(2, 1, dtype=torch.bool)}, [2]))  # fmt: skip
    assert out["next", COUNT_KEY].eq(1).all()
    with pytest.raises(KeyError, match="recurrent_state_memory"):
        module(TensorDict({"x": torch.randn(2, F_IN),
                           "is_init": torch.zeros(2, 1, dtype=torch.bool)}, [2]))  # fmt: skip


@pytest.mark.parametrize("count", [-1.0, 5.0, 1.5, float("nan")])
def test_a_count_that_is_not_an_integer_in_range_is_refused(count):
    module = make(4)
    td = TensorDict({"x": torch.randn(1, F_IN), "is_init": torch.zeros(1, 1, dtype=torch.bool),
                     MEM_KEY: torch.zeros(1, 1, 4 * H),
                     COUNT_KEY: torch.full((1, 1, 1), count)}, [1])  # fmt: skip
    with pytest.raises(ValueError, match=r"integers in \[0, memory_length=4\]"):
        module(td)


def test_construction_errors():
    with pytest.raises(ValueError, match="only 'auto'"):
        make(recurrent_backend="scan")
    with pytest.raises(ValueError, match="num_heads must be a positive int dividing"):
        make(num_heads=3)
    with pytest.raises(ValueError, match="positive ints"):
        make(memory_length=0)
    with pytest.raises(ValueError, match="exclusive"):
        TransformerModule(3, 8, in_key="x", out_key="y", transformer=GatedTransformer(3, 8))
    with pytest.raises(ValueError, match="recurrent_recompute"):
        make().recurrent_recompute = "full"
    with pytest.raises(ValueError, match=r"must be \('next', 'recurrent_state_count'\)"):
        TransformerModule(3, 8, in_key="x", out_keys=["y", ("next", MEM_KEY), "count"])


def test_wraps_an_existing_network_and_tensor_call():
    net = GatedTransformer(F_IN, H, 2, memory_length=3)
    module = TransformerModule(in_key="x", out_key="y", transformer=net)
    assert module.rnn is net and module.config.memory_length == 3
    y, memory, count = module(x=torch.randn(5, F_IN), is_init=torch.ones(5, 1, dtype=torch.bool))
    assert y.shape == (5, H) and memory.shape == (5, 2, 3 * H) and count.shape == (5, 2, 1)


def test_recurrent_mode_needs_a_time_dim():
    with pytest.raises(ValueError, match="needs a time dimension"), set_recurrent_mode(True):
        make()(TensorDict({"x": torch.randn(F_IN), "is_init": torch.ones(1, dtype=torch.bool)}))


# --- under the collector, replay and burn-in -----------------------------------------------
def _policy(env, memory_length: int, num_layers: int):
    torch.manual_seed(0)
    obs_dim = env.observation_spec["observation"].shape[-1]
    module = TransformerModule(
        obs_dim, H, num_layers=num_layers, memory_length=memory_length,
        in_keys=["observation", *STATE_KEYS],
        out_keys=["features", *(("next", k) for k in STATE_KEYS)],
    )  # fmt: skip
    policy = Seq(
        module,
        Mod(nn.Linear(H, env.action_spec.n), in_keys=["features"], out_keys=["logits"]),
        Mod(
            lambda logits: torch.distributions.Categorical(logits=logits).sample(),
            in_keys=["logits"],
            out_keys=["action"],
        ),
    )
    return module, policy


def test_collector_contract_and_stored_memory_replay():
    """Collected with auto-wired primers; replay of every batch (later ones start
    mid-episode, from the stored memory) gives the collected features and final states."""
    env = make_torch_env("CartPole-v1", 4, seed=0)
    module, policy = _policy(env, memory_length=5, num_layers=2)
    check_collector_contract(env, module, policy, steps=24, batches=3, start_bound=0.05)


def test_burn_in_recomputes_the_stored_memory():
    """The memory at step s depends on the L*M steps before it only: a recurrent pass from an
    empty memory at max(episode start, s - L*M) gives, from s on, the outputs of the replay
    from the stored memory at s (and the collected ones)."""
    from recurrl.collectors import Collector

    layers, m = 2, 3
    env = make_torch_env("CartPole-v1", 3, seed=1)
    module, policy = _policy(env, memory_length=m, num_layers=layers)
    collector = Collector(env, policy, frames_per_batch=3 * 40)
    data = collector.rollout()
    collector.shutdown()
    is_init = data["is_init"].squeeze(-1)
    checked = 0
    for row in range(3):
        starts = is_init[row].nonzero().squeeze(-1).tolist()
        for s in range(1, 36, 5):
            episode_start = max(t for t in starts if t <= s)
            span = data[row, s : s + 5].exclude("features")
            span["is_init"][0] = True  # a slice start, as SliceSampler marks it
            burn = data[row, max(episode_start, s - layers * m) : s + 5].exclude("features")
            burn["is_init"][0] = True
            for key in STATE_KEYS:
                burn[key][0] = 0.0  # nothing stored: an empty memory
            with set_recurrent_mode(True), torch.no_grad():
                replayed = module(span)["features"]
                burned = module(burn)["features"][-span.shape[0] :]
            close(replayed, data[row, s : s + 5]["features"])
            close(burned, replayed)
            checked += s - layers * m > episode_start  # the burn-in window was cut short
    assert checked  # some slices really started from an empty memory mid-episode


# --- the trainer: --memory transformer -----------------------------------------------------
def test_registered_as_a_memory_and_its_backends():
    from recurrl.trainers.config import ModelConfig

    entry = MEMORY_REGISTRY["transformer"]
    assert entry.module is TransformerModule and entry.state_suffixes == ("memory", "count")
    assert entry.cell is None and entry.backend_refusal("auto") is None
    with pytest.raises(ValueError, match="only 'auto'"):
        ModelConfig(memory="transformer", recurrent_backend="scan")
    ModelConfig(memory="lstm", recurrent_backend="scan")  # the others are unaffected


def test_train_smoke(tmp_path):
    from recurrl.trainers.cli import main

    code = main(["train", "--memory", "transformer", "--frames", "2000", "--eval-episodes", "0",
                 "--quiet", "--no-plot", "--no-tensorboard",
                 "--run-dir", str(tmp_path / "run")])  # fmt: skip
    assert code == 0
