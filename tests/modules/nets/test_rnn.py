"""recurrl's python-native LSTMCell / GRUCell / LSTM / GRU against their torch.nn namesakes."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from recurrl.modules.nets import GRU, LSTM, GRUCell, LSTMCell

F_IN, H, P, T, B = 3, 5, 2, 4, 3
ATOL = 1e-5

CELLS = [(LSTMCell, nn.LSTMCell), (GRUCell, nn.GRUCell)]
RNNS = [(LSTM, nn.LSTM), (GRU, nn.GRU)]


pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _flatten(out: object) -> list[torch.Tensor]:
    """``output``, ``(h, c)`` or ``h`` as a flat list of tensors."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for item in out for t in _flatten(item)]  # type: ignore[attr-defined]


def _close(actual: object, expected: object) -> None:
    actual, expected = _flatten(actual), _flatten(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, atol=ATOL, rtol=1e-4)


def _grads(out: object, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Gradients of a fixed random linear function of ``out`` w.r.t. ``inputs``."""
    gen = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=gen)).sum() for o in _flatten(out))
    return torch.autograd.grad(loss, inputs)


def _pair(ours_cls: type, ref_cls: type, *args: object, **kwargs: object) -> tuple:
    """Our module and torch's, with our (freshly initialised) weights loaded into torch's."""
    ours, ref = ours_cls(*args, **kwargs), ref_cls(*args, **kwargs)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _hx(is_lstm: bool, *batch: int, num_layers: int | None = None, proj: int = 0) -> object:
    lead = () if num_layers is None else (num_layers,)
    h = torch.randn(*lead, *batch, proj or H, requires_grad=True)
    if not is_lstm:
        return h
    return h, torch.randn(*lead, *batch, H, requires_grad=True)


# -- cells -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ours_cls", "ref_cls"), CELLS)
@pytest.mark.parametrize("bias", [True, False])
def test_cell_state_dict_round_trips_with_torch(ours_cls: type, ref_cls: type, bias: bool) -> None:
    ours, ref = ours_cls(F_IN, H, bias=bias), ref_cls(F_IN, H, bias=bias)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in ref.state_dict().items()
    }
    assert repr(ours) == repr(ref)
    x = torch.randn(B, F_IN)
    ours.load_state_dict(ref.state_dict())  # torch -> ours
    _close(ours(x), ref(x))
    ours.reset_parameters()
    ref.load_state_dict(ours.state_dict())  # ours -> torch
    _close(ours(x), ref(x))


@pytest.mark.parametrize(("ours_cls", "ref_cls"), CELLS)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_hx", [True, False])
def test_cell_matches_torch_forward_and_grads(
    ours_cls: type, ref_cls: type, batched: bool, with_hx: bool
) -> None:
    ours, ref = _pair(ours_cls, ref_cls, F_IN, H)
    is_lstm = ours_cls is LSTMCell
    batch = (B,) if batched else ()
    x = torch.randn(*batch, F_IN, requires_grad=True)
    hx = _hx(is_lstm, *batch) if with_hx else None
    out, expected = ours(x, hx), ref(x, hx)
    assert _flatten(out)[0].shape == (*batch, H)
    _close(out, expected)
    inputs = [x, *(_flatten(hx) if with_hx else []), *ref.parameters()]
    ours_inputs = [x, *(_flatten(hx) if with_hx else []), *ours.parameters()]
    _close(_grads(out, ours_inputs), _grads(expected, inputs))


@pytest.mark.parametrize("cls", [LSTMCell, GRUCell])
def test_cell_under_vmap_over_inputs_and_stacked_params(cls: type) -> None:
    cells = [cls(F_IN, H) for _ in range(4)]
    xs = torch.randn(4, B, F_IN)

    per_input = torch.vmap(cells[0])(xs)
    _close(per_input, [torch.stack(t) for t in zip(*[_flatten(cells[0](x)) for x in xs])])

    params, buffers = torch.func.stack_module_state(cells)
    call = lambda p, b, x: torch.func.functional_call(cells[0], (p, b), (x,))  # noqa: E731
    per_params = torch.vmap(call, in_dims=(0, 0, None))(params, buffers, xs[0])
    _close(per_params, [torch.stack(t) for t in zip(*[_flatten(c(xs[0])) for c in cells])])


# -- multi-step modules ------------------------------------------------------------------------

RNN_CASES = [
    (ours, ref, layers, bias, batch_first, proj, with_hx)
    for (ours, ref), layers, bias, batch_first, proj, with_hx in itertools.product(
        RNNS, [1, 2, 3], [True, False], [False, True], [0, P], [False, True]
    )
    if proj == 0 or ours is LSTM
]


@pytest.mark.parametrize(
    ("ours_cls", "ref_cls", "layers", "bias", "batch_first", "proj", "with_hx"), RNN_CASES
)
def test_rnn_matches_torch_forward_and_grads(
    ours_cls: type,
    ref_cls: type,
    layers: int,
    bias: bool,
    batch_first: bool,
    proj: int,
    with_hx: bool,
) -> None:
    kwargs = {"num_layers": layers, "bias": bias, "batch_first": batch_first}
    if proj:
        kwargs["proj_size"] = proj
    ours, ref = _pair(ours_cls, ref_cls, F_IN, H, **kwargs)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert repr(ours) == repr(ref)
    x = torch.randn(*((B, T) if batch_first else (T, B)), F_IN, requires_grad=True)
    hx = _hx(ours_cls is LSTM, B, num_layers=layers, proj=proj) if with_hx else None

    out, expected = ours(x, hx), ref(x, hx)
    assert out[0].shape == (*x.shape[:2], proj or H)
    _close(out, expected)
    extra = _flatten(hx) if with_hx else []
    _close(
        _grads(out, [x, *extra, *ours.parameters()]),
        _grads(expected, [x, *extra, *ref.parameters()]),
    )


@pytest.mark.parametrize(("ours_cls", "ref_cls"), RNNS)
@pytest.mark.parametrize("batch_first", [False, True])
def test_rnn_unbatched_input(ours_cls: type, ref_cls: type, batch_first: bool) -> None:
    ours, ref = _pair(ours_cls, ref_cls, F_IN, H, num_layers=2, batch_first=batch_first)
    x = torch.randn(T, F_IN)
    hx = _hx(ours_cls is LSTM, num_layers=2)
    out, expected = ours(x, hx), ref(x, hx)
    assert out[0].shape == (T, H) and _flatten(out[1])[0].shape == (2, H)
    _close(out, expected)
    _close(ours(x), ref(x))
    # an unbatched sequence is the batch-of-one sequence, squeezed
    batched = ours(x.unsqueeze(0 if batch_first else 1))
    _close(ours(x)[0], batched[0].squeeze(0 if batch_first else 1))


def test_rnn_state_dict_loads_from_torch_and_flat_weights_order() -> None:
    ref = nn.LSTM(F_IN, H, num_layers=2, proj_size=P, bias=True)
    ours = LSTM(F_IN, H, num_layers=2, proj_size=P)
    ours.load_state_dict(ref.state_dict())
    assert ours._flat_weights_names == ref._flat_weights_names
    assert len(ours.flat_weights) == len(ref._flat_weights) == 10
    for a, b in zip(ours.flat_weights, ref._flat_weights, strict=True):
        assert torch.equal(a, b)
    gru, ref_gru = GRU(F_IN, H, num_layers=3, bias=False), nn.GRU(F_IN, H, 3, bias=False)
    assert [p.shape for p in gru.flat_weights] == [p.shape for p in ref_gru._flat_weights]


@pytest.mark.parametrize("cls", [LSTM, GRU, LSTMCell, GRUCell])
def test_init_dtype_and_device(cls: type) -> None:
    module = cls(F_IN, 16, dtype=torch.float64, device="cpu")
    for param in module.parameters():
        assert param.dtype == torch.float64
        assert param.abs().max() <= 1 / 4 and param.std() > 0.05  # U(-1/sqrt(H), 1/sqrt(H))


@pytest.mark.parametrize(("ours_cls", "ref_cls"), RNNS)
def test_dropout_between_layers_only_in_training(ours_cls: type, ref_cls: type) -> None:
    ours, ref = _pair(ours_cls, ref_cls, F_IN, H, num_layers=3, dropout=0.5)
    x = torch.randn(T, B, F_IN)
    ours.eval()
    ref.eval()
    _close(ours(x), ref(x))
    ours.train()
    first, second = ours(x)[0], ours(x)[0]
    assert not torch.allclose(first, second)
    assert not torch.allclose(first, ours.eval()(x)[0])

    # p=1 zeroes every layer's input but the first's: the last layer then sees zeros only.
    ours, ref = _pair(ours_cls, ref_cls, F_IN, H, num_layers=2, dropout=1.0)
    last = ours_cls(H, H)
    last.load_state_dict(
        {k.replace("_l1", "_l0"): v for k, v in ours.state_dict().items() if k.endswith("_l1")}
    )
    _close(ours(x)[0], last(torch.zeros(T, B, H))[0])
    _close(ours(x)[0], ref(x)[0])


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_rnn_under_vmap_over_inputs_and_stacked_params(cls: type) -> None:
    kwargs = {"proj_size": P} if cls is LSTM else {}
    modules = [cls(F_IN, H, num_layers=2, batch_first=True, **kwargs) for _ in range(3)]
    xs = torch.randn(3, B, T, F_IN)

    per_input = torch.vmap(modules[0])(xs)
    _close(per_input, [torch.stack(t) for t in zip(*[_flatten(modules[0](x)) for x in xs])])

    hxs = _hx(cls is LSTM, 3, B, num_layers=2, proj=kwargs.get("proj_size", 0))
    # hx is [L, N, B, *]: map over its second dimension
    with_hx = torch.vmap(modules[0], in_dims=(0, 1))(xs, hxs)
    per_example = [
        _flatten(modules[0](x, tuple(t[:, i] for t in hxs) if cls is LSTM else hxs[:, i]))
        for i, x in enumerate(xs)
    ]
    _close(with_hx, [torch.stack(t) for t in zip(*per_example)])

    params, buffers = torch.func.stack_module_state(modules)
    call = lambda p, b, x: torch.func.functional_call(modules[0], (p, b), (x,))  # noqa: E731
    per_params = torch.vmap(call, in_dims=(0, 0, 0))(params, buffers, xs)
    expected = [torch.stack(t) for t in zip(*[_flatten(m(x)) for m, x in zip(modules, xs)])]
    _close(per_params, expected)

    # per-member gradients of an ensemble: vmap(grad(functional_call))
    def loss(p: dict, b: dict, x: torch.Tensor) -> torch.Tensor:
        return _flatten(torch.func.functional_call(modules[0], (p, b), (x,)))[0].square().sum()

    grads = torch.vmap(torch.func.grad(loss))(params, buffers, xs)
    for i, (module, x) in enumerate(zip(modules, xs)):
        names, tensors = zip(*module.named_parameters())
        expected_grads = torch.autograd.grad(_flatten(module(x))[0].square().sum(), tensors)
        _close([grads[n][i] for n in names], list(expected_grads))


def test_rnn_compiles_without_graph_breaks() -> None:
    lstm = LSTM(F_IN, H, num_layers=2, proj_size=P, batch_first=True)
    x = torch.randn(B, T, F_IN)
    compiled = torch.compile(lstm, backend="eager", fullgraph=True)
    _close(compiled(x), lstm(x))


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_rnn_constructor_errors(cls: type) -> None:
    with pytest.raises(ValueError, match=rf"bidirectional.*torch\.nn\.{cls.__name__}"):
        cls(F_IN, H, bidirectional=True)
    for dropout in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match=r"dropout.*\[0, 1\]"):
            cls(F_IN, H, num_layers=2, dropout=dropout)
    with pytest.warns(UserWarning, match="num_layers=1"):
        cls(F_IN, H, dropout=0.5)
    with pytest.raises(TypeError, match="hidden_size should be an int"):
        cls(F_IN, 5.0)
    with pytest.raises(ValueError, match="num_layers must be greater than zero, received 0"):
        cls(F_IN, H, num_layers=0)
    with pytest.raises(ValueError, match="input_size must be greater than zero"):
        cls(0, H)


def test_lstm_proj_size_errors() -> None:
    with pytest.raises(ValueError, match=r"smaller than hidden_size.*proj_size=5"):
        LSTM(F_IN, H, proj_size=H)
    with pytest.raises(ValueError, match="non-negative"):
        LSTM(F_IN, H, proj_size=-1)
    with pytest.raises(TypeError):
        GRU(F_IN, H, proj_size=2)  # like torch.nn.GRU, no projection


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_rnn_forward_errors(cls: type) -> None:
    module = cls(F_IN, H, num_layers=2)
    is_lstm = cls is LSTM
    with pytest.raises(ValueError, match=r"2D \[T, F\] or 3D \[T, B, F\], got 4D"):
        module(torch.randn(2, T, B, F_IN))
    with pytest.raises(RuntimeError, match=r"expected shape \[4, 3, 3\], received \[4, 3, 7\]"):
        module(torch.randn(T, B, 7))
    with pytest.raises(RuntimeError, match=r"expected shape \[2, 3, 5\], received \[2, 4, 5\]"):
        module(torch.randn(T, B, F_IN), _hx(is_lstm, 4, num_layers=2))
    with pytest.raises(RuntimeError, match=r"expected shape \[2, 3, 5\], received \[2, 5\]"):
        module(torch.randn(T, B, F_IN), _hx(is_lstm, num_layers=2))  # unbatched hx
    with pytest.raises(RuntimeError, match=r"expected shape \[2, 5\], received \[2, 3, 5\]"):
        module(torch.randn(T, F_IN), _hx(is_lstm, B, num_layers=2))  # batched hx
    with pytest.raises(RuntimeError, match="sequence length larger than 0"):
        module(torch.randn(0, B, F_IN))
    with pytest.raises(TypeError, match="hx"):
        module(torch.randn(T, B, F_IN), torch.zeros(2, B, H) if is_lstm else [torch.zeros(2, B, H)])
    packed = pack_padded_sequence(torch.randn(T, B, F_IN), torch.tensor([4, 3, 2]))
    with pytest.raises(TypeError, match="PackedSequence"):
        module(packed)


def test_lstm_projection_hx_shape_error() -> None:
    module = LSTM(F_IN, H, proj_size=P)
    hx = (torch.zeros(1, B, H), torch.zeros(1, B, H))
    with pytest.raises(RuntimeError, match=r"hx\[0\]: expected shape \[1, 3, 2\], received"):
        module(torch.randn(T, B, F_IN), hx)


@pytest.mark.parametrize("cls", [LSTMCell, GRUCell])
def test_cell_errors(cls: type) -> None:
    cell = cls(F_IN, H)
    with pytest.raises(ValueError, match=r"1D \[F\] or 2D \[B, F\], got 3D"):
        cell(torch.randn(2, B, F_IN))
    with pytest.raises(RuntimeError, match=r"expected shape \[3, 3\], received \[3, 4\]"):
        cell(torch.randn(B, 4))
    with pytest.raises(RuntimeError, match=r"expected shape \[3, 5\], received \[2, 5\]"):
        cell(torch.randn(B, F_IN), _hx(cls is LSTMCell, 2))
    with pytest.raises(RuntimeError, match=r"expected shape \[5\], received \[3, 5\]"):
        cell(torch.randn(F_IN), _hx(cls is LSTMCell, B))
    with pytest.raises(TypeError, match="hidden_size should be an int"):
        cls(F_IN, "5")


def test_a_network_without_its_hooks_names_them():
    from recurrl.modules.nets.rnn import _missing_hook

    class Half:
        pass

    message = _missing_hook(Half(), "_step(x_proj, state, layer)")
    assert message.startswith("Half does not implement _step(x_proj, state, layer)")
    assert "_state_sizes, _unpack_hx, _input_bias, _step" in message
