"""Reference drivers shared by the recurrent-module tests.

The reference of recurrent mode is the module itself in *sequential* mode, called one step
at a time with the state threaded by hand, exactly as a collector does.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import Tensor

from recurrl.modules import GRUModule, LSTMModule, RecurrentModule, set_recurrent_mode

MODULES = {"lstm": LSTMModule, "gru": GRUModule}
F_IN, H = 3, 4


def make_module(kind: str, *, hidden: int = H, **kwargs) -> RecurrentModule:
    """A module reading ``"x"`` and writing ``"y"`` with the default state keys."""
    kwargs.setdefault("input_size", F_IN)
    return MODULES[kind](hidden_size=hidden, in_key="x", out_key="y", **kwargs)


def state_shapes(module: RecurrentModule) -> list[tuple[int, ...]]:
    """``[num_layers, S]`` of every state key."""
    return [tuple(shape) for shape, _ in module.recurrent_state_spec.values()]


def random_is_init(shape: tuple[int, ...], p: float = 0.3, *, first: bool | None = None) -> Tensor:
    """Random restart flags ``[*B, T]``; ``first`` forces the value at ``t = 0``."""
    is_init = torch.rand(shape) < p
    if first is not None:
        is_init[..., 0] = first
    return is_init


def step_loop(
    module: RecurrentModule, x: Tensor, is_init: Tensor, init_states: list[Tensor]
) -> dict[str, object]:
    """Run ``module`` in sequential mode over ``x [*B, T, F]``, one step per call.

    The state given to each call is the one carried from the previous step (also at
    ``is_init`` steps: sequential mode must zero it itself). Returns the outputs, the state a
    collector would store at every step (the primer's zeros at ``is_init``, else the carried
    state) and the next states, each with a time dim at ``-3`` (states) or ``-2`` (output).
    """
    batch, steps = x.shape[:-2], x.shape[-2]
    keys = module.state_keys
    carry = list(init_states)
    ys, stored, nexts = [], [], []
    with set_recurrent_mode(False):
        for t in range(steps):
            init_t = is_init[..., t]
            td = TensorDict(
                {"x": x[..., t, :], "is_init": init_t.unsqueeze(-1)},
                batch_size=batch,
            )
            for key, value in zip(keys, carry, strict=True):
                td.set(key, value)
            stored.append([torch.where(init_t[..., None, None], 0.0, c) for c in carry])
            module(td)
            ys.append(td["y"])
            carry = [td["next", key] for key in keys]
            nexts.append(carry)
    stack = lambda seq: torch.stack(seq, dim=len(batch))  # noqa: E731
    return {
        "y": stack(ys),
        "stored": [stack([s[k] for s in stored]) for k in range(len(keys))],
        "next": [stack([n[k] for n in nexts]) for k in range(len(keys))],
    }


def sequence_td(
    module: RecurrentModule, x: Tensor, is_init: Tensor, states: list[Tensor]
) -> TensorDict:
    """Recurrent-mode data ``[*B, T]`` holding ``x``, ``is_init`` and the stored states."""
    td = TensorDict({"x": x, "is_init": is_init.unsqueeze(-1)}, batch_size=x.shape[:-1])
    for key, value in zip(module.state_keys, states, strict=True):
        td.set(key, value)
    return td


def run_recurrent(module: RecurrentModule, td: TensorDict) -> TensorDict:
    with set_recurrent_mode(True):
        return module(td)


def trajectory_end_mask(is_init: Tensor) -> Tensor:
    """``[*B, T]`` True at the step before each restart and at the last step."""
    ends = torch.ones_like(is_init)
    ends[..., :-1] = is_init[..., 1:]
    return ends


def random_sequence(module: RecurrentModule, batch: tuple[int, ...] = (2, 5)) -> TensorDict:
    """Random recurrent-mode data for ``module``: inputs, restarts and noisy stored states."""
    states = [torch.randn(*batch, *shape) for shape in state_shapes(module)]
    return sequence_td(module, torch.randn(*batch, F_IN), random_is_init(batch), states)


def outputs_of(module: RecurrentModule, td: TensorDict) -> list[Tensor]:
    """The module's output ``"y"`` and its next states, as written in ``td``."""
    return [td["y"], *(td["next", k] for k in module.state_keys)]


ATOL = 1e-5
KINDS = ["lstm", "gru"]
#: (recurrent_backend, python_based)
BACKENDS = [("pad", False), ("scan", False), ("auto", False), ("pad", True), ("scan", True)]
BACKEND_IDS = [f"{b}{'-python' if p else ''}" for b, p in BACKENDS]
SHAPES = {"T": (), "BT": (3,), "B1B2T": (2, 2)}
T = 7


def close(actual: Tensor, expected: Tensor) -> None:
    """float32 comparison used across the module tests."""
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=1e-4)


def random_states(module: RecurrentModule, *batch: int) -> list[Tensor]:
    """Noisy stored states of ``module``'s shapes with leading dims ``batch``."""
    return [torch.randn(*batch, *shape) for shape in state_shapes(module)]


def twin_of(module: RecurrentModule, **kwargs) -> RecurrentModule:
    """A module of the same kind and size with ``module``'s weights and other options."""
    cfg = module.config
    kwargs.setdefault("dropout", cfg.dropout)
    if cfg.proj_size:
        kwargs["proj_size"] = cfg.proj_size
    twin = make_module(
        cfg.mode,
        input_size=cfg.input_size,
        hidden=cfg.hidden_size,
        num_layers=cfg.num_layers,
        bias=cfg.bias,
        **kwargs,
    )
    twin.load_state_dict(module.state_dict())
    return twin
