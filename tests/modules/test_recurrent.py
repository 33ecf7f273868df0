"""The shared ``RecurrentModule`` behaviour, run for both ``LSTMModule`` and ``GRUModule``.

Pins the hidden-state contract of ``docs/ARCHITECTURE.md``: sequential mode zeroes the
incoming state at ``is_init``; recurrent mode starts every row from the state stored at its
first step and restarts from the state *stored* at every ``is_init``; ``("next", state)`` is
exact at every trajectory end and zero elsewhere; both modes agree.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict, pad_sequence

from recurrl.modules import set_recurrent_mode

from ._reference import (
    BACKEND_IDS,
    BACKENDS,
    F_IN,
    KINDS,
    SHAPES,
    T,
    close,
    make_module,
    outputs_of,
    random_is_init,
    random_sequence,
    random_states,
    run_recurrent,
    sequence_td,
    state_shapes,
    step_loop,
    trajectory_end_mask,
    twin_of,
)

pytestmark = pytest.mark.filterwarnings("ignore:dropout option adds dropout after all but last")


# ----------------------------------------------------------------------------------------
# recurrent mode == sequential step loop
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("backend", "python_based"), BACKENDS, ids=BACKEND_IDS)
def test_recurrent_mode_matches_step_loop(kind, shape, num_layers, bias, backend, python_based):
    module = make_module(
        kind, num_layers=num_layers, bias=bias, recurrent_backend=backend, python_based=python_based
    )
    x = torch.randn(*shape, T, F_IN)
    # random first flags: rows that start mid-episode begin from a non-zero stored state
    is_init = random_is_init((*shape, T))
    is_init[..., 3] = True  # at least one mid-row reset in every row
    ref = step_loop(module, x, is_init, random_states(module, *shape))

    out = run_recurrent(module, sequence_td(module, x, is_init, ref["stored"]))

    close(out["y"], ref["y"])
    ends = trajectory_end_mask(is_init)[..., None, None]
    for key, expected in zip(module.state_keys, ref["next"], strict=True):
        close(out["next", key], torch.where(ends, expected, 0.0))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("backend", "python_based"), BACKENDS, ids=BACKEND_IDS)
def test_recurrent_mode_one_step_matches_sequential(kind, backend, python_based):
    module = make_module(kind, num_layers=2, recurrent_backend=backend, python_based=python_based)
    x, is_init = torch.randn(4, 1, F_IN), torch.tensor([True, False, True, False])[:, None]
    states = random_states(module, 4, 1)
    seq = run_recurrent(module, sequence_td(module, x, is_init, states))
    # in recurrent mode a row restarts from the stored state even where is_init is True
    step = sequence_td(module, x[:, 0], torch.zeros(4, dtype=torch.bool), [s[:, 0] for s in states])
    module(step)
    close(seq["y"][:, 0], step["y"])
    for key in module.state_keys:
        close(seq["next", key][:, 0], step["next", key])


# ----------------------------------------------------------------------------------------
# no leak across is_init, restart from the stored state
# ----------------------------------------------------------------------------------------
def _two_trajectories(module, t_a: int = 4, t_b: int = 4):
    x = torch.randn(1, t_a + t_b, F_IN)
    states = random_states(module, 1, t_a + t_b)  # noise everywhere, even at the restarts
    is_init = torch.zeros(1, t_a + t_b, dtype=torch.bool)
    is_init[0, 0] = is_init[0, t_a] = True
    return x, states, is_init


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("backend", "python_based"), BACKENDS, ids=BACKEND_IDS)
def test_packed_trajectory_equals_standalone(kind, backend, python_based):
    """The tutorial's check: the second of two packed trajectories equals it run alone."""
    module = make_module(kind, num_layers=2, recurrent_backend=backend, python_based=python_based)
    t_a = 4
    x, states, is_init = _two_trajectories(module, t_a)
    packed = run_recurrent(module, sequence_td(module, x, is_init, states))
    alone = run_recurrent(
        module,
        sequence_td(module, x[:, t_a:], is_init[:, t_a:], [s[:, t_a:] for s in states]),
    )
    close(packed["y"][:, t_a:], alone["y"])
    for key in module.state_keys:
        close(packed["next", key][:, -1], alone["next", key][:, -1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("backend", "python_based"), BACKENDS, ids=BACKEND_IDS)
def test_first_trajectory_does_not_leak_into_second(kind, backend, python_based):
    module = make_module(kind, num_layers=2, recurrent_backend=backend, python_based=python_based)
    t_a = 4
    x, states, is_init = _two_trajectories(module, t_a)
    x.requires_grad_(True)
    for s in states:
        s.requires_grad_(True)
    out = run_recurrent(module, sequence_td(module, x, is_init, states))
    second = out["y"][:, t_a:]

    # other inputs and stored states in the first trajectory, other noise at every
    # non-restart step of the second: the second trajectory's outputs do not move
    x2 = x.detach().clone()
    x2[:, :t_a] = torch.randn_like(x2[:, :t_a])
    states2 = [
        torch.where(
            is_init[..., None, None] & (torch.arange(8) >= t_a)[:, None, None],
            s.detach(),
            torch.randn_like(s),
        )
        for s in states
    ]
    out2 = run_recurrent(module, sequence_td(module, x2, is_init, states2))
    assert not torch.allclose(out2["y"][:, :t_a], out["y"][:, :t_a].detach())
    close(out2["y"][:, t_a:], second.detach())
    for key in module.state_keys:
        close(out2["next", key][:, -1], out["next", key][:, -1].detach())

    # and no gradient flows from the second trajectory into the first one
    grads = torch.autograd.grad(second.sum(), [x, *states])
    assert grads[0][:, :t_a].abs().max() == 0
    assert grads[0][:, t_a:].abs().max() > 0
    for g in grads[1:]:
        used = is_init[0].clone()
        used[0] = False  # only the second trajectory's stored start feeds its outputs
        assert g[0, ~used].abs().max() == 0
        assert g[0, t_a].abs().max() > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("backend", "python_based"), BACKENDS, ids=BACKEND_IDS)
@pytest.mark.parametrize("slice_start_flag", [True, False])
def test_slice_starting_mid_episode_replays_collectedoutputs_of(
    kind, backend, python_based, slice_start_flag
):
    """Recurrent mode restarts from the STORED state: a replayed slice that starts
    mid-episode with the collected state reproduces the collected outputs."""
    module = make_module(kind, num_layers=2, recurrent_backend=backend, python_based=python_based)
    steps, start = 9, 4
    x = torch.randn(2, steps, F_IN)
    is_init = torch.zeros(2, steps, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[1, 6] = True  # an episode boundary inside the slice of row 1
    collected = step_loop(module, x, is_init, random_states(module, 2))

    sliced_init = is_init[:, start:].clone()
    sliced_init[:, 0] = slice_start_flag  # a sampler marks slice starts with is_init
    stored = [s[:, start:] for s in collected["stored"]]
    assert all(s[:, 0].abs().sum() > 0 for s in stored)  # mid-episode: non-zero
    out = run_recurrent(module, sequence_td(module, x[:, start:], sliced_init, stored))
    close(out["y"], collected["y"][:, start:])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("backend", "python_based"), BACKENDS, ids=BACKEND_IDS)
def test_restart_uses_stored_state_not_zeros(kind, backend, python_based):
    module = make_module(kind, recurrent_backend=backend, python_based=python_based)
    x = torch.randn(1, 6, F_IN)
    is_init = torch.tensor([[True, False, False, True, False, False]])
    states = random_states(module, 1, 6)
    out = run_recurrent(module, sequence_td(module, x, is_init, states))
    suffix = run_recurrent(
        module, sequence_td(module, x[:, 3:], is_init[:, 3:], [s[:, 3:] for s in states])
    )
    close(out["y"][:, 3:], suffix["y"])
    zeroed = [s.clone() for s in states]
    for s in zeroed:
        s[:, 3] = 0
    out_zero = run_recurrent(module, sequence_td(module, x, is_init, zeroed))
    assert not torch.allclose(out_zero["y"][:, 3:], out["y"][:, 3:], atol=1e-4)
    # the first row still starts from its stored (non-zero) state, not from zeros
    close(out_zero["y"][:, :3], out["y"][:, :3])


# ----------------------------------------------------------------------------------------
# ("next", state) at trajectory ends
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_next_state_exact_at_trajectory_ends_for_every_backend(kind):
    torch.manual_seed(3)
    base = make_module(kind, num_layers=2)
    x = torch.randn(3, 8, F_IN)
    is_init = random_is_init((3, 8), 0.35)
    is_init[0, 1] = is_init[1, 7] = True  # length-1 pieces at both ends of a row
    states = random_states(base, 3, 8)
    ends = trajectory_end_mask(is_init)
    results = []
    for backend, python_based in BACKENDS:
        module = twin_of(base, recurrent_backend=backend, python_based=python_based)
        out = run_recurrent(module, sequence_td(module, x, is_init, states))
        for key in module.state_keys:
            assert out["next", key][~ends].abs().max() == 0
        for row in range(3):
            starts = [0, *is_init[row, 1:].nonzero().squeeze(-1).add(1).tolist(), 8]
            for a, b in itertools.pairwise(starts):
                if a == b:
                    continue
                alone = run_recurrent(
                    module,
                    sequence_td(
                        module,
                        x[row : row + 1, a:b],
                        is_init[row : row + 1, a:b],
                        [s[row : row + 1, a:b] for s in states],
                    ),
                )
                for key in module.state_keys:
                    close(out["next", key][row, b - 1], alone["next", key][0, -1])
        results.append(out)
    for other in results[1:]:
        close(other["y"], results[0]["y"])
        for key in base.state_keys:
            close(other["next", key], results[0]["next", key])


@pytest.mark.parametrize("kind", KINDS)
def test_backends_agree_on_gradients_through_module(kind):
    base = make_module(kind, num_layers=2)
    x = torch.randn(3, 6, F_IN)
    is_init = random_is_init((3, 6), 0.4)
    states = random_states(base, 3, 6)
    weights = torch.randn(3, 6, base.config.output_size)
    configs = [*BACKENDS, ("scan-full", False), ("scan-full", True)]
    results = []
    for backend, python_based in configs:
        recompute = "full" if backend == "scan-full" else "none"
        module = twin_of(
            base,
            recurrent_backend=backend.split("-")[0],
            python_based=python_based,
            recurrent_recompute=recompute,
        )
        leaves = [x.clone().requires_grad_(True), *(s.clone().requires_grad_(True) for s in states)]
        out = run_recurrent(module, sequence_td(module, leaves[0], is_init, leaves[1:]))
        loss = (out["y"] * weights).sum() + sum(
            out["next", k].pow(2).sum() for k in module.state_keys
        )
        params = list(module.parameters())
        grads = torch.autograd.grad(loss, [*leaves, *params])
        results.append((out["y"].detach(), grads))
    for y, grads in results[1:]:
        close(y, results[0][0])
        for g, g_ref in zip(grads, results[0][1], strict=True):
            close(g, g_ref)


# ----------------------------------------------------------------------------------------
# sequential mode
# ----------------------------------------------------------------------------------------
def _torch_step(module, x, states, is_init):
    """One step of the wrapped torch network on flattened data, resets applied by hand."""
    batch = x.shape[:-1]
    n = batch.numel()
    hx = [s.reshape(n, *s.shape[-2:]).transpose(0, 1) * ~is_init.reshape(1, n, 1) for s in states]
    rnn = module.rnn
    y, out = rnn(x.reshape(n, 1, -1), tuple(hx) if len(hx) == 2 else hx[0])
    out = out if isinstance(out, tuple) else (out,)
    return y.reshape(*batch, -1), [h.transpose(0, 1).reshape(*batch, *h.shape[::2]) for h in out]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)], ids=["[]", "[B]", "[B1,B2]"])
def test_sequential_mode_any_batch_shape(kind, batch):
    module = make_module(kind, num_layers=2)
    x = torch.randn(*batch, F_IN)
    states = random_states(module, *batch)
    is_init = torch.rand(batch) < 0.5
    td = sequence_td(module, x, is_init, states)
    module(td)
    y, nxt = _torch_step(module, x, states, is_init)
    close(td["y"], y)
    for key, h in zip(module.state_keys, nxt, strict=True):
        assert td["next", key].shape == (*batch, *state_shapes(module)[0][:1], h.shape[-1])
        close(td["next", key], h)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)], ids=["[]", "[B]", "[B1,B2]"])
def test_sequential_unusual_inputs_match_usual_ones(kind, batch):
    # Inputs in the expected layout take a shortcut past the validating readers; an is_init
    # without its trailing dim or not bool, or states of another dtype, take the readers'
    # conversions: both give the same step.
    module = make_module(kind)
    x = torch.randn(*batch, F_IN)
    states = random_states(module, *batch)
    is_init = torch.rand(batch) < 0.5
    usual = module(sequence_td(module, x, is_init, states))
    td = sequence_td(module, x, is_init, [s.double() for s in states])
    td["is_init"] = is_init.to(torch.uint8)  # [*B], not [*B, 1]
    unusual = module(td)
    close(unusual["y"], usual["y"])
    for key in module.state_keys:
        close(unusual["next", key], usual["next", key])


@pytest.mark.parametrize("kind", KINDS)
def test_sequential_is_init_zeroes_incoming_state(kind):
    module = make_module(kind, num_layers=2)
    x = torch.randn(4, F_IN)
    noisy = random_states(module, 4)
    is_init = torch.tensor([True, False, True, False])
    out = module(sequence_td(module, x, is_init, noisy))
    zero = module(sequence_td(module, x, is_init, [torch.zeros_like(s) for s in noisy]))
    close(out["y"][is_init], zero["y"][is_init])
    assert not torch.allclose(out["y"][~is_init], zero["y"][~is_init])
    # and the gradient w.r.t. a state that is zeroed is exactly zero
    leaves = [s.clone().requires_grad_(True) for s in noisy]
    out = module(sequence_td(module, x, is_init, leaves))
    grads = torch.autograd.grad(out["y"].sum(), leaves)
    for g in grads:
        assert g[is_init].abs().max() == 0
        assert g[~is_init].abs().max() > 0


@pytest.mark.parametrize("kind", KINDS)
def test_sequential_missing_state_allowed_only_when_all_init(kind):
    module = make_module(kind)
    x = torch.randn(3, F_IN)
    td = TensorDict({"x": x, "is_init": torch.ones(3, 1, dtype=torch.bool)}, [3])
    module(td)
    zero = module(
        sequence_td(
            module,
            x,
            torch.ones(3, dtype=torch.bool),
            [torch.zeros(3, *s) for s in state_shapes(module)],
        )
    )
    close(td["y"], zero["y"])
    td = TensorDict({"x": x, "is_init": torch.tensor([[True], [False], [True]])}, [3])
    with pytest.raises(KeyError, match="TensorDictPrimer"):
        module(td)


def _without_states(x, is_init):
    return TensorDict({"x": x, "is_init": is_init.unsqueeze(-1)}, batch_size=x.shape[:-1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("backend", "python_based"), BACKENDS, ids=BACKEND_IDS)
def test_recurrent_missing_state_is_zeros_when_every_row_starts_an_episode(
    kind, backend, python_based
):
    # every row starts an episode at t = 0; later restarts are episode starts too, so the
    # state missing everywhere is the zero state everywhere it is read
    module = make_module(kind, recurrent_backend=backend, python_based=python_based)
    x, is_init = torch.randn(3, T, F_IN), random_is_init((3, T), first=True)
    zeros = [torch.zeros(3, T, *shape) for shape in state_shapes(module)]
    missing = run_recurrent(module, _without_states(x, is_init))
    given = run_recurrent(module, sequence_td(module, x, is_init, zeros))
    for a, e in zip(outputs_of(module, missing), outputs_of(module, given), strict=True):
        close(a, e)
    # ... and equal to the sequential loop from zeros (a module read by a fresh env)
    loop = step_loop(module, x, is_init, [torch.zeros(3, *sh) for sh in state_shapes(module)])
    close(missing["y"], loop["y"])


@pytest.mark.parametrize("kind", KINDS)
def test_recurrent_missing_state_raises_for_a_continuing_row(kind):
    module = make_module(kind)
    is_init = torch.ones(2, 3, dtype=torch.bool)
    is_init[1, 0] = False  # row 1 continues a trajectory: its stored state is needed
    td = _without_states(torch.randn(2, 3, F_IN), is_init)
    with pytest.raises(KeyError, match=r"TensorDictPrimer") as info:
        run_recurrent(module, td)
    assert "1 of 2 rows continue" in str(info.value)
    assert "first step" in str(info.value)
    # a restart later in the row does not make up for the missing state at t = 0
    is_init = torch.zeros(2, 3, dtype=torch.bool)
    is_init[:, 1] = True
    with pytest.raises(KeyError, match="2 of 2 rows continue"):
        run_recurrent(module, _without_states(torch.randn(2, 3, F_IN), is_init))


@pytest.mark.parametrize("kind", KINDS)
def test_sequential_missing_state_error_counts_continuing_rows(kind):
    module = make_module(kind)
    td = TensorDict(
        {"x": torch.randn(4, F_IN), "is_init": torch.tensor([[True], [False], [True], [False]])},
        [4],
    )
    with pytest.raises(KeyError, match=r"2 of 4 rows continue a trajectory \(is_init False\)"):
        module(td)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("recurrent", [False, True])
def test_missing_is_init_names_init_tracker(kind, recurrent):
    module = make_module(kind)
    batch = (2, 3) if recurrent else (2,)
    td = TensorDict({"x": torch.randn(*batch, F_IN)}, batch)
    for key, shape in zip(module.state_keys, state_shapes(module), strict=True):
        td.set(key, torch.zeros(*batch, *shape))
    with set_recurrent_mode(recurrent), pytest.raises(KeyError, match="InitTracker"):
        module(td)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("recurrent", [False, True])
def test_wrong_state_shape_names_expected_layout(kind, recurrent):
    module = make_module(kind, num_layers=2)
    batch = (2, 3) if recurrent else (2,)
    is_init = torch.zeros(batch, dtype=torch.bool)
    for bad in [(1, 4), (2, 5), (4,)]:
        states = [torch.zeros(*batch, *bad) for _ in module.state_keys]
        td = sequence_td(module, torch.randn(*batch, F_IN), is_init, states)
        with (
            set_recurrent_mode(recurrent),
            pytest.raises(ValueError, match=r"\[\*B, num_layers, H\]"),
        ):
            module(td)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("recurrent", [False, True])
def test_wrong_input_size_raises(kind, recurrent):
    module = make_module(kind)
    batch = (2, 3) if recurrent else (2,)
    states = [torch.zeros(*batch, *s) for s in state_shapes(module)]
    td = sequence_td(module, torch.randn(*batch, F_IN + 1), torch.zeros(batch, dtype=bool), states)
    with set_recurrent_mode(recurrent), pytest.raises(ValueError, match=str(F_IN)):
        module(td)
    del td["x"]
    with set_recurrent_mode(recurrent), pytest.raises(KeyError, match="'x'"):
        module(td)


@pytest.mark.parametrize("kind", KINDS)
def test_recurrent_mode_needs_a_time_dim(kind):
    module = make_module(kind)
    td = sequence_td(
        module,
        torch.randn(F_IN),
        torch.tensor(True),
        [torch.zeros(s) for s in state_shapes(module)],
    )
    with pytest.raises(ValueError, match="time dimension"):
        run_recurrent(module, td)


@pytest.mark.parametrize("kind", KINDS)
def test_wrong_is_init_shape_raises(kind):
    module = make_module(kind)
    states = [torch.zeros(2, *s) for s in state_shapes(module)]
    td = sequence_td(module, torch.randn(2, F_IN), torch.zeros(2, dtype=bool), states)
    td.set("is_init", torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="is_init"):
        module(td)


# ----------------------------------------------------------------------------------------
# layouts: strided views, transposed leaves, lazy stacks, padding
# ----------------------------------------------------------------------------------------


def _assert_sameoutputs_of(module, actual, expected):
    for a, e in zip(outputs_of(module, actual), outputs_of(module, expected), strict=True):
        close(a, e)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["pad", "scan"])
def test_strided_view_matches_contiguous(kind, backend):
    module = make_module(kind, num_layers=2, recurrent_backend=backend)
    big = sequence_td(
        module, torch.randn(4, 12, F_IN), random_is_init((4, 12)), random_states(module, 4, 12)
    )
    view = big[::2, ::2]
    assert not view["x"].is_contiguous()
    ref = run_recurrent(module, view.clone().contiguous())
    out = run_recurrent(module, view)
    _assert_sameoutputs_of(module, out, ref)
    with set_recurrent_mode(False):
        _assert_sameoutputs_of(
            module, module(big[::2, 3]), module(big[::2, 3].clone().contiguous())
        )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["pad", "scan"])
def test_transposed_leaves_match_contiguous(kind, backend):
    module = make_module(kind, num_layers=2, recurrent_backend=backend)
    x = torch.randn(5, 3, F_IN).transpose(0, 1)  # [B=3, T=5, F], time-major storage
    states = [torch.randn(s[1], s[0], 5, 3).permute(3, 2, 1, 0) for s in state_shapes(module)]
    is_init = random_is_init((5, 3)).t()
    td = sequence_td(module, x, is_init, states)
    assert not x.is_contiguous() and not states[0].is_contiguous()
    ref = run_recurrent(
        module,
        sequence_td(module, x.contiguous(), is_init.contiguous(), [s.contiguous() for s in states]),
    )
    _assert_sameoutputs_of(module, run_recurrent(module, td), ref)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["pad", "scan"])
@pytest.mark.parametrize("stack_dim", [0, 1])
def test_lazy_stack_matches_contiguous(kind, backend, stack_dim):
    module = make_module(kind, num_layers=2, recurrent_backend=backend)
    full = sequence_td(
        module, torch.randn(3, 6, F_IN), random_is_init((3, 6)), random_states(module, 3, 6)
    )
    ref = run_recurrent(module, full.clone())
    lazy = LazyStackedTensorDict.lazy_stack(list(full.clone().unbind(stack_dim)), stack_dim)
    assert isinstance(lazy, LazyStackedTensorDict) and lazy.batch_size == (3, 6)
    out = run_recurrent(module, lazy)
    _assert_sameoutputs_of(module, out, ref)
    # written leaves are reachable through the stacked parts too
    close(lazy.tensordicts[1]["y"], ref["y"].select(stack_dim, 1))


@pytest.mark.parametrize("kind", KINDS)
def test_lazy_stack_in_sequential_mode(kind):
    module = make_module(kind)
    full = sequence_td(
        module, torch.randn(3, F_IN), torch.tensor([True, False, False]), random_states(module, 3)
    )
    ref = module(full.clone())
    lazy = LazyStackedTensorDict.lazy_stack([full[i].clone() for i in range(3)], 0)
    _assert_sameoutputs_of(module, module(lazy), ref)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("backend", "python_based"), BACKENDS, ids=BACKEND_IDS)
def test_padded_sequences_match_unpadded(kind, backend, python_based):
    module = make_module(kind, num_layers=2, recurrent_backend=backend, python_based=python_based)
    lengths = [5, 2, 4]
    trajs = [
        sequence_td(module, torch.randn(n, F_IN), torch.arange(n) == 0, random_states(module, n))
        for n in lengths
    ]
    alone = [run_recurrent(module, t.clone().unsqueeze(0)) for t in trajs]
    padded = pad_sequence([t.clone() for t in trajs])  # zero-padded steps at the end
    assert padded.batch_size == (3, 5)
    out = run_recurrent(module, padded)
    for i, n in enumerate(lengths):
        close(out["y"][i, :n], alone[i]["y"][0])
    # with is_init on the first padded step, each real trajectory ends exactly there
    marked = padded.clone()
    for i, n in enumerate(lengths):
        if n < 5:
            marked["is_init"][i, n] = True
    out = run_recurrent(module, marked)
    for i, n in enumerate(lengths):
        close(out["y"][i, :n], alone[i]["y"][0])
        for key in module.state_keys:
            close(out["next", key][i, n - 1], alone[i]["next", key][0, -1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("inplace", [False, True])
def test_canonicalize(kind, inplace):
    module = make_module(kind)
    x = torch.randn(6, 2, F_IN).transpose(0, 1)
    reward = torch.randn(6, 2).t()
    h = torch.randn(6, 2, *state_shapes(module)[0]).transpose(0, 1)
    td = TensorDict(
        {
            "x": x,
            "reward": reward,
            "is_init": torch.zeros(2, 6, 1, dtype=bool),
            module.state_keys[0]: h,
        },
        [2, 6],
    )
    out = module.canonicalize(td, inplace=inplace)
    assert (out is td) == inplace
    for key in ["x", module.state_keys[0]]:
        assert out[key].is_contiguous()
        torch.testing.assert_close(out[key], td[key] if inplace else {"x": x}.get(key, h))
    # the input is left alone unless inplace
    assert td["x"].is_contiguous() == inplace and (td["x"] is x) != inplace
    # unrelated leaves keep their layout (and identity); missing keys are not created
    assert out["reward"] is reward and not reward.is_contiguous()
    assert set(out.keys(True, True)) == set(td.keys(True, True))
    assert "y" not in out and "next" not in out
    assert set(module.canonical_keys) == {*module.in_keys, *module.out_keys}


# ----------------------------------------------------------------------------------------
# torch.vmap and torch.compile
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("recurrent", [False, True])
def test_python_based_ensemble_under_vmap(kind, recurrent):
    """vmap of a functional call over an ensemble of python-based modules."""
    from torch.func import functional_call, stack_module_state

    members = [
        make_module(kind, num_layers=2, python_based=True, recurrent_backend="scan")
        for _ in range(3)
    ]
    params, buffers = stack_module_state(members)
    batch = (2, 5) if recurrent else (4,)
    data = sequence_td(
        members[0],
        torch.randn(*batch, F_IN),
        random_is_init(batch),
        random_states(members[0], *batch),
    )

    def call(p):
        with set_recurrent_mode(recurrent):
            out = functional_call(members[0], (p, buffers), (data.clone(),))
        return [out["y"], *(out["next", k] for k in members[0].state_keys)]

    outputs = torch.vmap(call)(params)
    for i, member in enumerate(members):
        with set_recurrent_mode(recurrent):
            expected = member(data.clone())
        for got, want in zip(outputs, outputs_of(member, expected), strict=True):
            close(got[i], want)


@pytest.mark.parametrize("kind", KINDS)
def test_compile_smoke_recurrent_mode_scan(kind):
    module = make_module(kind, num_layers=2, recurrent_backend="scan")
    data = random_sequence(module, (2, 6))

    @set_recurrent_mode(True)
    def forward(td):
        return module(td)

    compiled = torch.compile(forward, backend="eager")
    _assert_sameoutputs_of(module, compiled(data.clone()), forward(data.clone()))


def _hook_module_and_data():
    from recurrl.modules import LSTMModule

    module = LSTMModule(3, 4, in_key="x", out_key="y")
    td = TensorDict(
        {"x": torch.randn(2, 3), "is_init": torch.ones(2, 1, dtype=torch.bool)}, batch_size=[2]
    )
    return module, td


@pytest.mark.filterwarnings("ignore:For backward hooks to be called")
@pytest.mark.parametrize("hook", ["forward_pre", "forward", "global_forward", "backward"])
def test_call_runs_hooks_as_nn_module_does(hook):
    # __call__ skips nn.Module.__call__'s frames only when nothing hooks in
    module, td = _hook_module_and_data()
    calls, slow_calls = [], []
    call_impl = module._call_impl

    def spy(*args, **kwargs):
        slow_calls.append(1)
        return call_impl(*args, **kwargs)

    module._call_impl = spy
    module(td.clone())
    assert slow_calls == []
    if hook == "forward_pre":
        handle = module.register_forward_pre_hook(lambda m, args: calls.append(hook))
    elif hook == "forward":
        handle = module.register_forward_hook(lambda m, args, out: calls.append(hook))
    elif hook == "global_forward":
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, args, out: calls.append(hook)
        )
    else:
        # wired by nn.Module.__call__ on tensor arguments only (none here), so not called
        handle = module.register_full_backward_pre_hook(lambda m, grad: calls.append(hook))
    try:
        module(td.clone())
    finally:
        handle.remove()
    assert slow_calls == [1]
    assert calls == ([] if hook == "backward" else [hook])
    module(td.clone())
    assert slow_calls == [1]


def test_call_goes_through_a_compiled_call():
    module, td = _hook_module_and_data()
    seen = []

    def compiled(*args, **kwargs):
        seen.append(args)
        return module._call_impl(*args, **kwargs)

    module._compiled_call_impl = compiled
    out = module(td)
    assert len(seen) == 1 and out is td and "y" in td
