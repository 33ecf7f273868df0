"""The acting step of a TensorDict policy as a pure function of tensors: what export traces.

:func:`build_acting_step` walks a policy (``TensorDictSequential`` / ``TensorDictModule`` /
recurrent modules / recurrl's action samplers) once and turns it into an
:class:`ActingStep`, an ``nn.Module`` whose ``forward`` takes and returns plain tensors in a
fixed order: the policy's inputs (``"observation"``, ``"is_init"``, every recurrent state,
an optional noise input) in, the action, any extra output and every next state out. Nothing
in it reads a TensorDict, a global random generator or a Python value computed from data, so
``torch.export`` (and from it ONNX) traces it as one graph.

What is replaced on the way (the eager modules stay untouched):

* a recurrent module runs its cell kind's plain-torch step (never the C++ acting step or
  torch's fused cell operators), the reset at ``is_init`` applied first as a ``where``;
  cell kinds that compute in complex numbers register a real-arithmetic step
  (:func:`register_export_cell`; the LRU's is here);
* recurrl's samplers become their mode (greedy) or a function of a noise input (sample):
  Gumbel-max on uniform noise for categoricals, ``loc + scale * noise`` with standard normal
  noise for the squashed Gaussian, two uniforms per row for epsilon-greedy;
* ``EGreedyModule`` is the identity when greedy; ``QValueModule`` is its argmax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from tensordict.utils import NestedKey
from torch import Tensor, nn
from torch.nn import functional as F

from recurrl.envs.transforms.observation import ObservationTransform
from recurrl.functional.recurrent.lru import LRUKind, lru_lambda
from recurrl.modules import EGreedyModule, QValueModule, RecurrentModule
from recurrl.trainers.errors import UsageError
from recurrl.trainers.models import (
    CategoricalSampler,
    EpsilonGreedy,
    FactorizedCategoricalSampler,
    TanhNormalSampler,
)

__all__ = [
    "ActingStep",
    "ExportError",
    "build_acting_step",
    "key_name",
    "register_export_cell",
]

Key = tuple[str, ...]
IS_INIT: Key = ("is_init",)


class ExportError(UsageError):
    """A policy whose acting step cannot be exported; the message names the module and the fix."""


def _key(key: NestedKey) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


def key_name(key: NestedKey) -> str:
    """The input / output name of a TensorDict key: its parts joined with ``"_"``.

    Examples:
        >>> key_name(("next", "actor_h")), key_name("observation")
        ('next_actor_h', 'observation')
    """
    return "_".join(_key(key))


# ---------------------------------------------------------------------------- recurrent cells
class _KindStep(nn.Module):
    """``(x [N, F], *states [N, L, S]) -> (y, *new states)``: the cell kind's plain-torch step
    (:meth:`~recurrl.functional.recurrent.cell.CellKind.step` with ``fused=False``) layer by
    layer, as the eager multi-layer step runs it."""

    def __init__(self, module: RecurrentModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor, *states: Tensor) -> tuple[Tensor, ...]:
        cfg = self.module._current_config()
        weights = self.module._flat_weights()
        layer_in, new = x, []
        for layer in range(cfg.num_layers):
            w = cfg.layer_weights(weights, layer)
            out = cfg.kind.step(cfg, w, layer_in, tuple(s[:, layer] for s in states), fused=False)
            new.append(out)
            layer_in = out[0]
        return (layer_in, *(torch.stack(s, dim=1) for s in zip(*new, strict=True)))


class _LRURealStep(nn.Module):
    """The LRU step in real arithmetic (ONNX has no complex tensors): ``lambda`` and
    ``gamma`` are computed once here by :func:`~recurrl.functional.recurrent.lru.lru_lambda`
    (the eager ops) and kept as constants; the complex product ``lambda * h`` is written out
    on ``[Re h | Im h]``, the layout the state is stored in."""

    def __init__(self, module: RecurrentModule) -> None:
        super().__init__()
        self.module = module
        cfg = module._current_config()
        weights = module._flat_weights()
        for layer in range(cfg.num_layers):
            w = cfg.layer_weights(weights, layer)
            with torch.no_grad():
                lam, gamma = lru_lambda(w.nu_log, w.theta_log)
            self.register_buffer(f"lam_re_{layer}", lam.real.clone(), persistent=False)
            self.register_buffer(f"lam_im_{layer}", lam.imag.clone(), persistent=False)
            self.register_buffer(f"gamma_{layer}", gamma.clone(), persistent=False)

    def forward(self, x: Tensor, y_state: Tensor, h_state: Tensor) -> tuple[Tensor, ...]:
        cfg = self.module._current_config()
        weights = self.module._flat_weights()
        hid = cfg.hidden_size
        layer_in, ys, hs = x, [], []
        for layer in range(cfg.num_layers):
            w = cfg.layer_weights(weights, layer)
            lam_re, lam_im = getattr(self, f"lam_re_{layer}"), getattr(self, f"lam_im_{layer}")
            gamma = getattr(self, f"gamma_{layer}")
            xp = F.linear(layer_in, w.weight_ih, w.bias_ih)
            h_re, h_im = h_state[:, layer, :hid], h_state[:, layer, hid:]
            new_re = lam_re * h_re - lam_im * h_im + gamma * xp[:, :hid]
            new_im = lam_re * h_im + lam_im * h_re + gamma * xp[:, hid : 2 * hid]
            h_ri = torch.cat([new_re, new_im], dim=-1)
            layer_in = F.linear(h_ri, w.weight_ho) + xp[:, 2 * hid :]
            ys.append(layer_in)
            hs.append(h_ri)
        return layer_in, torch.stack(ys, dim=1), torch.stack(hs, dim=1)


#: cell kind name -> builder of the export step of a module of that kind (default:
class _TransformerStep(nn.Module):
    """:class:`~recurrl.modules.TransformerModule`'s step on its stored layout: ``memory [N,
    L, M * H]`` and ``count [N, L, 1]`` (float) in and out, the network's own
    :meth:`~recurrl.modules.nets.transformer.GatedTransformer.step` between (an empty memory
    at ``is_init``: the reset before it zeroes both). The eager module's check that a read
    count is an integer in ``[0, M]`` is left out: the graph only ever reads counts it wrote
    (or zeros), and a data-dependent raise cannot be exported."""

    def __init__(self, module: RecurrentModule) -> None:
        super().__init__()
        cfg = module._cfg
        self.net = module.rnn
        self.layers, self.m, self.size = cfg.num_layers, cfg.memory_length, cfg.hidden_size

    def forward(self, x: Tensor, memory: Tensor, count: Tensor) -> tuple[Tensor, ...]:
        n = x.shape[0]
        memory = memory.reshape(n, self.layers, self.m, self.size)
        y, memory, count = self.net.step(x, memory, count.reshape(n, self.layers).long())
        return (
            y,
            memory.reshape(n, self.layers, self.m * self.size),
            count.to(x.dtype).reshape(n, self.layers, 1),
        )


#: :class:`_KindStep`, the kind's own plain-torch step; a module without a cell kind is
#: looked up by its class name)
_EXPORT_CELLS: dict[str, Callable[[RecurrentModule], nn.Module]] = {
    LRUKind.name: _LRURealStep,
    "TransformerModule": _TransformerStep,
}


def register_export_cell(kind: str, builder: Callable[[RecurrentModule], nn.Module]) -> None:
    """Export modules of cell kind ``kind`` (for a module without a cell kind, such as
    :class:`~recurrl.modules.TransformerModule`: its class name) with ``builder(module)``: an
    ``nn.Module`` whose
    ``forward(x [N, F], *states [N, L, S])`` returns ``(y [N, O], *new states)`` without
    complex tensors or data-dependent Python (the kind's own step is used otherwise).

    Examples:
        >>> register_export_cell("lru", _EXPORT_CELLS["lru"])  # the built-in one, again
    """
    if not callable(builder):
        raise TypeError(
            f"register_export_cell: expected a builder module -> nn.Module, received "
            f"{type(builder).__name__}."
        )
    _EXPORT_CELLS[kind] = builder


class _RecurrentStep(nn.Module):
    """A recurrent module's sequential step: the reset at ``is_init`` (zero state, as the
    eager step), then the cell's export step."""

    def __init__(self, module: RecurrentModule) -> None:
        super().__init__()
        if getattr(module, "n_agents", None) is not None:
            raise ExportError(
                f"{type(module).__name__}(n_agents={module.n_agents}) runs over an agent group "
                f"(one state per agent); its step cannot be exported. Fix: export one-agent "
                f"policies only (a module built without n_agents)."
            )
        kind = getattr(module, "cell", None)  # the cell kind's name, None for attention
        build = _EXPORT_CELLS.get(kind if kind is not None else type(module).__name__)
        if build is None and kind is None:
            raise ExportError(
                f"{type(module).__name__} has no cell kind and no export step registered. "
                f"Fix: register_export_cell({type(module).__name__!r}, builder) with an "
                f"nn.Module computing its step on tensors."
            )
        self.cell = (build or _KindStep)(module)
        self.in_keys = [_key(k) for k in module.in_keys]  # input, *states, is_init
        self.out_keys = [_key(k) for k in module.out_keys]
        self.state_specs = {
            _key(k): v for k, v in module.recurrent_state_spec.items()
        }  # key -> ([L, S], dtype)

    def forward(self, x: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
        *states, is_init = rest
        keep = ~is_init.reshape(-1, 1, 1)
        states = [torch.where(keep, s, torch.zeros_like(s)) for s in states]
        return self.cell(x, *states)


# ---------------------------------------------------------------------------- action samplers
def _example_noise(shape: Sequence[int], normal: bool) -> Tensor:
    """Example noise for tracing and checking an export (fixed seed: reproducible files)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=gen) if normal else torch.rand(*shape, generator=gen)


def _gumbel(noise: Tensor) -> Tensor:
    """Gumbel noise ``-log(-log(u))`` from uniform ``u`` (clamped into ``(0, 1)``)."""
    tiny = torch.finfo(noise.dtype).tiny
    u = noise.clamp(tiny, 1.0 - torch.finfo(noise.dtype).eps)
    return -torch.log(-torch.log(u))


class _CategoricalStep(nn.Module):
    """``logits [N, A] (, noise [N, A]) -> action [N]``: the argmax (greedy) or the
    Gumbel-max sample ``argmax(logits + gumbel(noise))`` (exactly a categorical sample for
    uniform noise)."""

    def noise_like(self, logits: Tensor) -> Tensor:
        return _example_noise(logits.shape, normal=False)

    def forward(self, logits: Tensor, noise: Tensor | None = None) -> tuple[Tensor]:
        if noise is not None:
            logits = logits + _gumbel(noise)
        return (logits.argmax(-1),)


class _FactorizedStep(nn.Module):
    """``logits [N, sum(nvec)] (, noise) -> action [N, K]``: one categorical per entry."""

    def __init__(self, nvec: Sequence[int]) -> None:
        super().__init__()
        self.nvec = tuple(int(n) for n in nvec)

    def noise_like(self, logits: Tensor) -> Tensor:
        return _example_noise(logits.shape, normal=False)

    def forward(self, logits: Tensor, noise: Tensor | None = None) -> tuple[Tensor]:
        if noise is not None:
            logits = logits + _gumbel(noise)
        return (torch.stack([p.argmax(-1) for p in logits.split(self.nvec, dim=-1)], dim=-1),)


class _TanhNormalStep(nn.Module):
    """``(loc, scale) (, noise) -> action``: ``mid + half * tanh(u)`` with ``u = loc``
    (greedy, :attr:`ScaledTanhNormal.mode`) or ``u = loc + scale * noise`` (standard normal
    noise: a sample)."""

    def __init__(self, low: Tensor, high: Tensor) -> None:
        super().__init__()
        # not "half": nn.Module.half() exists
        self.register_buffer("center", ((high + low) / 2).detach().clone(), persistent=False)
        self.register_buffer("radius", ((high - low) / 2).detach().clone(), persistent=False)

    def noise_like(self, loc: Tensor) -> Tensor:
        return _example_noise(loc.shape, normal=True)

    def forward(self, loc: Tensor, scale: Tensor, noise: Tensor | None = None) -> tuple[Tensor]:
        u = loc if noise is None else loc + scale * noise
        return (self.center + self.radius * torch.tanh(u),)


class _EpsilonGreedyStep(nn.Module):
    """``action_value [N, A] (, noise [N, 2]) -> action [N]``: the argmax, or with noise a
    uniform action ``floor(noise[:, 1] * A)`` where ``noise[:, 0] < epsilon``."""

    def __init__(self, epsilon: float) -> None:
        super().__init__()
        self.epsilon = float(epsilon)

    def noise_like(self, values: Tensor) -> Tensor:
        return _example_noise((values.shape[0], 2), normal=False)

    def forward(self, values: Tensor, noise: Tensor | None = None) -> tuple[Tensor]:
        greedy = values.argmax(-1)
        if noise is None:
            return (greedy,)
        n = values.shape[-1]
        uniform = (noise[:, 1] * n).long().clamp(0, n - 1)
        return (torch.where(noise[:, 0] < self.epsilon, uniform, greedy),)


class _QValueStep(nn.Module):
    """:class:`~recurrl.modules.QValueModule` on tensors: ``(values [, mask]) -> (action,
    values, chosen value)``."""

    def __init__(self, module: QValueModule) -> None:
        super().__init__()
        self.one_hot = module.action_space != "categorical"
        self.dtype = torch.long if module.spec is None else module.spec.dtype
        self.masked = module.action_mask_key is not None

    def forward(self, values: Tensor, mask: Tensor | None = None) -> tuple[Tensor, ...]:
        low = torch.finfo(values.dtype).min
        scores = values if mask is None else values.masked_fill(~mask, low)
        index = scores.argmax(-1)
        chosen = values.gather(-1, index.unsqueeze(-1))
        action = F.one_hot(index, values.shape[-1]).to(self.dtype) if self.one_hot else index
        return action, values, chosen


#: the noise each sampler reads: its distribution and its size from the parameters' shape
NOISE = {
    _CategoricalStep: "uniform(0,1)",
    _FactorizedStep: "uniform(0,1)",
    _TanhNormalStep: "normal(0,1)",
    _EpsilonGreedyStep: "uniform(0,1)",
}


# ---------------------------------------------------------------------------- generic steps
class _ModuleStep(nn.Module):
    """A ``TensorDictModule``'s wrapped module, called on tensors as tensordict calls it."""

    def __init__(self, module: Callable, kwargs: Sequence[str] | None, n_out: int) -> None:
        super().__init__()
        if isinstance(module, nn.Module):
            self.module = module
        else:  # a plain callable: kept as is (not a submodule)
            object.__setattr__(self, "fn", module)
        self.kwargs = list(kwargs) if kwargs else None
        self.n_out = n_out

    def forward(self, *xs: Tensor) -> tuple[Tensor, ...]:
        fn = self.module if "module" in self._modules else self.fn
        out = fn(**dict(zip(self.kwargs, xs, strict=True))) if self.kwargs else fn(*xs)
        out = out if isinstance(out, tuple) else (out,)
        return tuple(out[: self.n_out])


class _TransformStep(nn.Module):
    """An env :class:`~recurrl.envs.transforms.ObservationTransform`'s ``_apply_transform``
    (the transform is not a submodule: its env is not part of the graph)."""

    def __init__(self, transform: ObservationTransform) -> None:
        super().__init__()
        object.__setattr__(self, "transform", transform)

    def forward(self, x: Tensor) -> tuple[Tensor]:
        return (self.transform._apply_transform(x),)


@dataclass
class Step:
    """One node of the acting step: a tensor function and the keys it reads and writes."""

    fn: nn.Module
    in_keys: list[Key]
    out_keys: list[Key]
    owner: str  # where it comes from, for the error messages
    noise: Key | None = None  # the noise input of a sampler in sample mode


class _Planner:
    """Turns a policy into :class:`Step` s (one pass over its modules)."""

    def __init__(self, sample: bool) -> None:
        self.sample = sample
        self.steps: list[Step] = []

    def add_transform(self, transform: object, owner: str) -> None:
        if not isinstance(transform, ObservationTransform):
            raise ExportError(
                f"export: {owner} ({type(transform).__name__}) is not an ObservationTransform; "
                f"only those (one tensor in, one out: MaskObservation, OneHotObservation, ...) "
                f"can be put inside the graph. Fix: pass only the observation transforms, and "
                f"apply the others outside the exported policy."
            )
        step = _TransformStep(transform)
        self.steps.append(Step(step, [_key(transform.in_key)], [_key(transform.out_key)], owner))

    def walk(self, module: nn.Module, owner: str) -> None:
        name = f"{owner} ({type(module).__name__})"
        if isinstance(module, TensorDictSequential):
            for i, sub in enumerate(module.module):
                self.walk(sub, f"{owner}[{i}]")
        elif isinstance(module, RecurrentModule):
            step = _RecurrentStep(module)
            self.steps.append(Step(step, step.in_keys, step.out_keys, name))
        elif isinstance(module, QValueModule):
            step = _QValueStep(module)
            self.steps.append(Step(step, [_key(k) for k in module.in_keys],
                                   [_key(k) for k in module.out_keys], name))  # fmt: skip
        elif isinstance(module, EGreedyModule):
            if self.sample:
                raise ExportError(
                    f"export: {name} explores with torch's global random generator, which an "
                    f"exported graph cannot hold. Fix: export greedy (sample=False / --greedy: "
                    f"the module is then the identity), or use recurrl.trainers.models."
                    f"EpsilonGreedy, whose sample export reads a noise input."
                )
        elif isinstance(module, TensorDictModule):
            self._module(module, name)
        else:
            kind = "a TensorDictModuleBase" if isinstance(module, TensorDictModuleBase) else (
                "not a TensorDict module")  # fmt: skip
            raise ExportError(
                f"export: cannot export {name}: it is {kind} whose forward reads and writes a "
                f"TensorDict, which the exporter cannot turn into a tensor function. Fix: wrap "
                f"its tensor computation in a tensordict.nn.TensorDictModule(module, in_keys, "
                f"out_keys) (a recurrent memory: a recurrl RecurrentModule)."
            )

    def _module(self, module: TensorDictModule, name: str) -> None:
        inner = module.module
        ins = [_key(k) for k in module.in_keys]
        outs = [_key(k) for k in module.out_keys]
        sampler = self._sampler(inner, name)
        if sampler is None:
            kwargs = getattr(module, "_kwargs", None)
            self.steps.append(Step(_ModuleStep(inner, kwargs, len(outs)), ins, outs, name))
            return
        noise = None
        if self.sample:
            noise = (f"{key_name(outs[0])}_noise",)
            ins = [*ins, noise]
        self.steps.append(Step(sampler, ins, outs[:1], name, noise))

    def _sampler(self, inner: object, name: str) -> nn.Module | None:
        if isinstance(inner, CategoricalSampler):
            return _CategoricalStep()
        if isinstance(inner, FactorizedCategoricalSampler):
            return _FactorizedStep(inner.nvec)
        if isinstance(inner, TanhNormalSampler):
            return _TanhNormalStep(inner.low, inner.high)
        if isinstance(inner, EpsilonGreedy):
            eps = inner.epsilons
            if self.sample and len(set(eps)) > 1:
                raise ExportError(
                    f"export: {name} holds one epsilon per row ({eps}); a sampled export "
                    f"takes a single epsilon. Fix: set one (module.epsilon = e), or export "
                    f"greedy."
                )
            return _EpsilonGreedyStep(eps[0])
        return None


# ---------------------------------------------------------------------------- the graph
class ActingStep(nn.Module):
    """The acting step as a pure tensor function: ``forward(*inputs) -> outputs``.

    Attributes:
        input_keys: the TensorDict keys of the inputs, in ``forward``'s order.
        output_keys: the keys of the outputs, in the returned order.
        state_keys: the recurrent state inputs; ``next_state_keys[i]`` is the output that
            holds ``state_keys[i]`` at the next step.
        noise_keys: the noise inputs (sample mode) -> their distribution.
    """

    def __init__(self, steps: list[Step], outputs: Sequence[Key]) -> None:
        super().__init__()
        self.steps = steps
        self._fns = nn.ModuleList([s.fn for s in steps])  # parameters and buffers
        written: set[Key] = set()
        inputs: list[Key] = []
        for s in steps:
            inputs += [k for k in s.in_keys if k not in written and k not in inputs]
            written.update(s.out_keys)
        recurrent = [s for s in steps if isinstance(s.fn, _RecurrentStep)]
        # one entry per state (a shared trunk appears twice: the actor's and the critic's)
        states = dict.fromkeys(k for s in recurrent for k in s.in_keys[1:-1] if k in inputs)
        self.state_keys = list(states)
        self.next_state_keys = [("next", *k) for k in self.state_keys]
        self.state_specs = {k: v for s in recurrent for k, v in s.fn.state_specs.items()}
        self.noise_keys = {s.noise: NOISE[type(s.fn)] for s in steps if s.noise is not None}
        others = [k for k in inputs if k not in self.state_keys and k not in self.noise_keys]
        others.sort(key=lambda k: k == IS_INIT)  # is_init after the observations
        self.input_keys = [*others, *self.state_keys, *self.noise_keys]
        self.output_keys = [*outputs, *[k for k in self.next_state_keys if k not in outputs]]

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        values = dict(zip(self.input_keys, inputs, strict=True))
        for step in self.steps:
            out = step.fn(*(values[k] for k in step.in_keys))
            values.update(zip(step.out_keys, out, strict=False))
        return tuple(values[k] for k in self.output_keys)

    def probe(self, inputs: Sequence[Tensor]) -> dict[Key, Tensor]:
        """Run eagerly, step by step, naming the step that fails or returns a non-tensor;
        returns every value (inputs and intermediates) by key."""
        values = dict(zip(self.input_keys, inputs, strict=True))
        for step in self.steps:
            if step.noise is not None and values[step.noise] is None:
                values[step.noise] = step.fn.noise_like(values[step.in_keys[0]])
            try:
                with torch.no_grad():
                    out = step.fn(*(values[k] for k in step.in_keys))
            except Exception as err:
                raise ExportError(
                    f"export: {step.owner} failed on the example inputs ({type(err).__name__}: "
                    f"{err}). Fix: check that the example holds what the policy reads."
                ) from err
            for key, value in zip(step.out_keys, out, strict=False):
                if not isinstance(value, Tensor):
                    raise ExportError(
                        f"export: {step.owner} returns a {type(value).__name__} for "
                        f"{key_name(key)!r}, not a tensor; an exported graph holds tensors "
                        f"only. Fix: compute it with torch operations."
                    )
                values[key] = value
        return values


def build_acting_step(
    policy: nn.Module,
    *,
    sample: bool = False,
    transforms: Sequence[ObservationTransform] = (),
    outputs: Sequence[NestedKey] = ("action",),
) -> ActingStep:
    """The :class:`ActingStep` of ``policy``: ``transforms`` (env-side observation transforms,
    applied first) then the policy's modules, pruned to what ``outputs`` (and the next states
    of the recurrent modules they need) depend on.

    Args:
        policy: a TensorDict module (``TensorDictSequential`` of ``TensorDictModule`` s,
            recurrl recurrent modules, recurrl samplers, ``QValueModule``...).
        sample: samplers read a noise input instead of taking their mode.
        transforms: observation transforms of the env to put inside the graph.
        outputs: the keys to return before the next states.

    Examples:
        >>> from tensordict.nn import TensorDictModule as Mod, TensorDictSequential as Seq
        >>> from recurrl.modules import GRUModule
        >>> policy = Seq(GRUModule(3, 4, in_key="observation", out_key="f"),
        ...              Mod(nn.Linear(4, 2), ["f"], ["logits"]),
        ...              Mod(CategoricalSampler(), ["logits"], ["action", "log_prob"]))
        >>> step = build_acting_step(policy)
        >>> [key_name(k) for k in step.input_keys], [key_name(k) for k in step.output_keys]
        (['observation', 'is_init', 'recurrent_state'], ['action', 'next_recurrent_state'])
    """
    planner = _Planner(sample)
    for i, transform in enumerate(transforms):
        planner.add_transform(transform, f"transforms[{i}]")
    planner.walk(policy, "policy")
    wanted = [_key(k) for k in outputs]
    written = {k for s in planner.steps for k in s.out_keys}
    missing = [key_name(k) for k in wanted if k not in written]
    if missing:
        available = sorted({key_name(k) for k in written})
        raise ExportError(
            f"export: the policy writes no {missing}; it writes {available}. Fix: outputs= "
            f"among those (a sampler in sample mode writes only the action)."
        )
    # keep the steps the outputs depend on (a recurrent step brings its next state along)
    needed, kept = set(wanted), []
    for step in reversed(planner.steps):
        if any(k in needed for k in step.out_keys):
            kept.append(step)
            needed.update(step.in_keys)
            needed.difference_update(k for k in step.out_keys if k not in step.in_keys)
    return ActingStep(list(reversed(kept)), wanted)
