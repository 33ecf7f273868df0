"""``RecurrentModule``: the TensorDict adapter shared by :class:`LSTMModule` and :class:`GRUModule`.

The module reads an input, its stored hidden state and ``is_init`` from a TensorDict, runs a
stacked LSTM/GRU and writes the output and ``("next", state)``. LSTM and GRU differ only in
the cell (``"lstm"``/``"gru"``) and in the number of state tensors (2 or 1), which the
subclasses declare; everything else lives here.

Two execution modes (see :class:`~recurrl.modules.set_recurrent_mode`):

* sequential (default): one step for any batch ``[*B]``; ``is_init`` True zeroes the incoming
  state (the env just reset);
* recurrent: time is the last batch dim; each row starts from the state stored at its first
  step and every ``is_init`` True restarts from the state stored at that step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import Tensor, nn
from torch.nn.modules import module as _torch_module

from recurrl.functional.recurrent import (
    RNNConfig,
    fused_runner,
    recurrent_step,
    recurrent_unroll,
)
from recurrl.modules._agents import AgentDimension, python_runner
from recurrl.modules._arg_docs import complete_arguments_doc
from recurrl.modules._env_transforms import env_transform_builders
from recurrl.modules._fast_step import StepPlan, fast_step, step_plan
from recurrl.modules._readers import IS_INIT_KEY, CheckedReaders, _as_key, _show
from recurrl.modules._settings import RecurrentSettings
from recurrl.modules.recurrent_mode import _current

__all__ = ["RecurrentModule"]

#: torch's global module hooks (dicts that registration fills in place): any of them makes
#: ``RecurrentModule.__call__`` go through ``nn.Module.__call__``; the shortcut is off if a
#: torch version lacks one of them
_GLOBAL_HOOKS = tuple(
    getattr(_torch_module, name, None)
    for name in (
        "_global_backward_pre_hooks",
        "_global_backward_hooks",
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
    )
)
_CALL_SHORTCUT = None not in _GLOBAL_HOOKS


def _check_layout(name: str, batch_first: object, bidirectional: object) -> None:
    """``batch_first``/``bidirectional`` are accepted at the only values the module can run."""
    if batch_first is not True:
        raise ValueError(
            f"{name}: only batch_first=True is supported, got batch_first={batch_first!r}. "
            f"The module reads TensorDicts whose time dim is the last batch dim ([*B, T] in "
            f"recurrent mode), so there is no time-major layout to choose. Fix: drop the "
            f"argument (or pass batch_first=True); for time-major data, move time last first "
            f"(e.g. td.transpose(0, 1) for a [T, B] TensorDict)."
        )
    if bidirectional is not False:
        raise ValueError(
            f"{name}: only bidirectional=False is supported, got "
            f"bidirectional={bidirectional!r}. A backward pass over time needs the future of "
            f"the trajectory, which a policy acting one step at a time does not have, and it "
            f"could not be carried in the hidden state between steps. Fix: drop the argument "
            f"(or pass bidirectional=False)."
        )


class RecurrentModule(AgentDimension, RecurrentSettings, CheckedReaders, TensorDictModuleBase):
    """Base class of the recurrent TensorDict modules: their keys, their two modes and their
    constructor, the one every recurrent module shares (:class:`LSTMModule`,
    :class:`GRUModule`, :class:`MinGRUModule`, :class:`LRUModule` are named entry points to
    it with the reference library's signatures).

    A module for another cell kind is a subclass that declares four class attributes and no
    ``__init__``: ``cell`` (a registered cell kind), ``network_class`` (the network it builds
    or wraps, in ``nn.LSTM``'s layout), ``default_state_keys`` (one key per state) and,
    optionally, ``python_network_class`` (a python-native twin for ``python_based=True``) and
    ``network_attr`` (the attribute holding the network; default ``"network"``). Register it
    with :func:`~recurrl.modules.register_memory` to train it with ``recurrl train
    --memory``; see ``docs/adding_a_cell.md``.

    A module reads ``in_keys = [input, *states, "is_init"]`` and writes ``out_keys =
    [output, *(("next", state) for state in states)]``; every state is
    ``[*B, num_layers, S]`` (``S`` the state's size, ``hidden_size`` unless the subclass says
    otherwise).

    * Sequential mode (default): input ``[*B, input_size]``; ``is_init`` True zeroes the
      incoming state of that element.
    * Recurrent mode (inside ``set_recurrent_mode(True)`` or with
      ``default_recurrent_mode=True``): input ``[*B, T, input_size]`` with time the last batch
      dim; each row starts from the state stored at its first step and restarts from the
      stored state at every ``is_init``. The ``("next", state)`` outputs are exact at every
      trajectory end (the step before an ``is_init`` and the last step) and zero elsewhere.

    The arguments below are documented here once. A subclass's docstring documents only its
    own arguments and those it describes differently (the state keys, the wrapped network);
    the rest are added to it when the class is created, in the order of its ``__init__``, so
    ``help()`` and the rendered docs of every subclass list all of its arguments.

    Args:
        input_size: features of the input.
        hidden_size: features of the hidden state.
        num_layers: stacked layers. Default: 1.
        bias: use ``b_ih``/``b_hh``. Default: True.
        dropout: dropout on the outputs of every layer but the last (training). Default: 0.
        python_based: use recurrl's python-native network instead of torch's fused one
            (works under ``torch.vmap``/``torch.compile``). Default: False.
        recurrent_backend: how recurrent mode runs a batch with resets: ``"auto"`` (the
            default: the fastest backend that runs the input, picked per batch by
            :func:`~recurrl.functional.recurrent.resolve_backend`, which documents the
            rule), ``"pad"`` (split at resets, torch's fused kernel on the pieces),
            ``"scan"`` (time loop with ``where``), ``"triton"`` (GPU kernel), ``"cpp"``
            (scan's loop in C++ on CPU, compiled on first use) or any name of
            :func:`~recurrl.functional.recurrent.recurrent_backend_names`. All give the
            same numbers up to float rounding. Default: "auto".
        recurrent_compute_dtype: dtype of the ``triton`` backend's recurrent matmul
            (``torch.float32`` or ``torch.bfloat16``). Default: ``torch.float32``.
        recurrent_recompute: ``"none"`` or ``"full"`` (recompute activations in backward;
            ``"pad"`` cannot and raises; ``"auto"`` then picks among the others).
            Default: "none".
        recurrent_matmul_precision: precision of the ``triton`` backend's matmul:
            ``"ieee"``, ``"tf32"``, ``"tf32x3"``, ``"fast"``, ``"high-prec"`` or ``"auto"``.
            Default: "auto".
        proj_size: output projection size of an LSTM (0 for none; other cells refuse
            projections). Default: 0.

    Keyword Args:
        in_key: the input key; the state keys default to the class's
            ``default_state_keys``. Exclusive with ``in_keys``.
        in_keys: ``[input, *states]`` keys (``"is_init"`` is appended). Exclusive with
            ``in_key``.
        out_key: the output key; the state outputs default to ``("next", <state key>)``.
            Exclusive with ``out_keys``.
        out_keys: ``[output, *(("next", state) for state in states)]``. Exclusive with
            ``out_key``.
        device: device of the parameters.
        rnn: an existing network (a ``network_class`` or ``python_network_class``) to wrap,
            exclusive with the arguments that build one.
        default_recurrent_mode: mode when no ``set_recurrent_mode`` is active. Default: False.
        batch_first: accepted for compatibility; only ``True`` is supported (time is the last
            batch dim of the TensorDict). Anything else raises ``ValueError``.
        bidirectional: accepted for compatibility; only ``False`` is supported (a policy
            acts one step at a time). Anything else raises ``ValueError``.
        n_agents: the size of an agent dim (multi-agent envs, see
            ``docs/guides/multiagent.md``), or ``None`` (one agent per env row). With it the
            input key is nested under the agent group (``("agents", "observation")``
            ``[*B, n_agents, F]``), the states default to the class's state keys under the
            group (``[*B, n_agents, L, S]``) and ``is_init`` is the group's: each agent's
            state is reset at its own episode starts (and at its row's env-level
            ``"is_init"``). Default: None.
        share_params: one network for every agent (True) or one per agent (False, with
            ``n_agents``: ``agent_networks``, the first being :attr:`rnn`, the others
            initialised independently). Default: True.

    Examples:
        A module of torch's GRU with its own state key, declared in four lines:

        >>> import torch
        >>> from tensordict import TensorDict
        >>> class MyGRU(RecurrentModule):
        ...     cell = "gru"
        ...     network_class = torch.nn.GRU
        ...     default_state_keys = ("memory",)
        >>> module = MyGRU(3, 8, in_key="obs", out_key="features")
        >>> module.in_keys, module.rnn.hidden_size
        (['obs', 'memory', 'is_init'], 8)
        >>> step = TensorDict({"obs": torch.randn(4, 3),
        ...                    "is_init": torch.ones(4, 1, dtype=torch.bool)}, batch_size=[4])
        >>> module(step)["next", "memory"].shape
        torch.Size([4, 1, 8])
    """

    #: The cell kind the module runs (a name of the cell registry,
    #: :func:`~recurrl.functional.recurrent.cell.register_cell_kind`): ``"lstm"``, ``"gru"``...
    cell: ClassVar[str]
    #: The network class built from ``input_size``, ``hidden_size``, ... (torch's ``nn.LSTM``
    #: layout: ``cls(input_size, hidden_size, num_layers, bias=, batch_first=True, dropout=,
    #: device=)``, weights in ``_flat_weights`` order), or accepted as ``rnn=``.
    network_class: ClassVar[type[nn.Module]]
    #: A python-native twin of ``network_class`` with the same parameters (what
    #: ``python_based=True`` runs), or ``None``: the module then refuses ``python_based``.
    python_network_class: ClassVar[type[nn.Module] | None] = None
    #: Default names of the state keys, one per state of the cell (``in_key=`` uses them).
    default_state_keys: ClassVar[tuple[str, ...]]
    #: The attribute holding the wrapped network (``"lstm"`` for ``LSTMModule``); the
    #: :attr:`rnn` property reads it whatever its name.
    network_attr: ClassVar[str] = "network"

    # the internal names of the class attributes above (kept in sync by __init_subclass__)
    _mode: ClassVar[str]
    _rnn_name: ClassVar[str] = "network"
    _default_state_keys: ClassVar[tuple[str, ...]]
    _torch_cls: ClassVar[type[nn.Module]]
    _python_cls: ClassVar[type[nn.Module] | None] = None

    _PUBLIC = (
        ("cell", "_mode"), ("network_class", "_torch_cls"),
        ("python_network_class", "_python_cls"), ("default_state_keys", "_default_state_keys"),
        ("network_attr", "_rnn_name"),
    )  # fmt: skip

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for public, private in RecurrentModule._PUBLIC:
            if public in cls.__dict__:
                setattr(cls, private, cls.__dict__[public])
            elif private in cls.__dict__:
                setattr(cls, public, cls.__dict__[private])
        # the shared argument documentation, nearest base first (a subclass of LSTMModule
        # gets the LSTM's entries)
        bases = [b.__doc__ for b in cls.__mro__[1:] if issubclass(b, RecurrentModule)]
        complete_arguments_doc(cls, *bases)

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        dropout: float = 0.0,
        python_based: bool = False,
        recurrent_backend: str = "auto",
        recurrent_compute_dtype: torch.dtype = torch.float32,
        recurrent_recompute: str = "none",
        recurrent_matmul_precision: str = "auto",
        proj_size: int = 0,
        *,
        in_key: NestedKey | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        device: torch.device | str | None = None,
        rnn: nn.Module | None = None,
        default_recurrent_mode: bool | None = None,
        batch_first: bool = True,
        bidirectional: bool = False,
        n_agents: int | None = None,
        share_params: bool = True,
    ) -> None:
        missing = [p for p in ("cell", "network_class", "default_state_keys")
                   if not hasattr(type(self), p)]  # fmt: skip
        if missing:
            raise TypeError(
                f"{type(self).__name__}: a RecurrentModule subclass declares the class "
                f"attributes cell, network_class and default_state_keys; missing {missing}. "
                f"Fix: use LSTMModule / GRUModule / MinGRUModule / LRUModule, or declare them "
                f"(see docs/adding_a_cell.md)."
            )
        super().__init__()
        self._setup(
            input_size=input_size, hidden_size=hidden_size, num_layers=num_layers, bias=bias,
            dropout=dropout, proj_size=proj_size, python_based=python_based,
            recurrent_backend=recurrent_backend, recurrent_compute_dtype=recurrent_compute_dtype,
            recurrent_recompute=recurrent_recompute,
            recurrent_matmul_precision=recurrent_matmul_precision, in_key=in_key,
            in_keys=in_keys, out_key=out_key, out_keys=out_keys, device=device, rnn=rnn,
            default_recurrent_mode=default_recurrent_mode, batch_first=batch_first,
            bidirectional=bidirectional, n_agents=n_agents, share_params=share_params,
        )  # fmt: skip

    def _setup(
        self,
        *,
        input_size: int | None,
        hidden_size: int | None,
        num_layers: int,
        bias: bool,
        dropout: float,
        proj_size: int,
        python_based: bool,
        recurrent_backend: str,
        recurrent_compute_dtype: torch.dtype,
        recurrent_recompute: str,
        recurrent_matmul_precision: str,
        in_key: NestedKey | None,
        in_keys: Sequence[NestedKey] | None,
        out_key: NestedKey | None,
        out_keys: Sequence[NestedKey] | None,
        device: torch.device | str | None,
        rnn: nn.Module | None,
        default_recurrent_mode: bool | None,
        batch_first: bool = True,
        bidirectional: bool = False,
        n_agents: int | None = None,
        share_params: bool = True,
    ) -> None:
        name = type(self).__name__
        _check_layout(name, batch_first, bidirectional)
        self.in_keys, self.out_keys = self._agent_keys(
            n_agents, share_params, in_key, in_keys, out_key, out_keys
        )
        rnn = self._build_rnn(
            rnn, input_size, hidden_size, num_layers, bias, dropout, proj_size, device
        )
        options = self._checked(
            recurrent_backend, recurrent_recompute, recurrent_compute_dtype,
            recurrent_matmul_precision, python_based=python_based, device=device,
            proj_size=getattr(rnn, "proj_size", 0),
        )  # fmt: skip
        if default_recurrent_mode is not None and not isinstance(default_recurrent_mode, bool):
            raise ValueError(
                f"{name}: default_recurrent_mode must be a bool or None, "
                f"got {default_recurrent_mode!r}."
            )
        if python_based and isinstance(rnn, self._torch_cls):
            rnn = self._convert(rnn, self._python_twin())
        elif not python_based and self._python_cls and isinstance(rnn, self._python_cls):
            python_based = True
        self._set_rnn(rnn, python_based)
        # validated above; the properties below validate later assignments
        self._recurrent_options = options
        self.default_recurrent_mode = bool(default_recurrent_mode)

    # ------------------------------------------------------------------ construction
    def _resolve_keys(
        self,
        in_key: NestedKey | None,
        in_keys: Sequence[NestedKey] | None,
        out_key: NestedKey | None,
        out_keys: Sequence[NestedKey] | None,
    ) -> tuple[list[NestedKey], list[NestedKey]]:
        name = type(self).__name__
        n_states = len(self._default_state_keys)
        if (in_key is None) == (in_keys is None):
            raise ValueError(
                f"{name}: pass exactly one of in_key (the input key; the state keys then "
                f"default to {list(self._default_state_keys)}) or in_keys (input and state "
                f"keys), got in_key={in_key!r} and in_keys={in_keys!r}."
            )
        if (out_key is None) == (out_keys is None):
            raise ValueError(
                f"{name}: pass exactly one of out_key or out_keys, got out_key={out_key!r} "
                f"and out_keys={out_keys!r}."
            )
        for arg, value, what in (("in_keys", in_keys, "input, *states"),
                                 ("out_keys", out_keys, "output, *next states")):  # fmt: skip
            # list("abc") would be ['a', 'b', 'c']: a str is never a list of keys here
            if isinstance(value, str):
                raise ValueError(
                    f"{name}: {arg} must be a list of {n_states + 1} keys [{what}], received "
                    f"the str {value!r}. Fix: {arg[:-1]}={value!r} for one key (the others "
                    f"default), or {arg}=[{value!r}, ...] with every key."
                )
        if in_key is not None:
            in_keys = [in_key, *self._default_state_keys]
        in_keys = list(in_keys)
        if len(in_keys) == n_states + 2 and in_keys[-1] == IS_INIT_KEY:
            in_keys = in_keys[:-1]
        if len(in_keys) != n_states + 1:
            raise ValueError(
                f"{name}: in_keys must hold {n_states + 1} keys [input, "
                f"{', '.join('state' for _ in range(n_states))}], got {in_keys!r}."
            )
        if out_key is not None:
            out_keys = [out_key, *(("next", *_as_key(k)) for k in in_keys[1:])]
        out_keys = list(out_keys)
        if len(out_keys) != n_states + 1:
            raise ValueError(
                f"{name}: out_keys must hold {n_states + 1} keys [output, "
                f"{', '.join('next state' for _ in range(n_states))}], got {out_keys!r}."
            )
        for k_in, k_out in zip(in_keys[1:], out_keys[1:], strict=True):
            if _as_key(k_out) != ("next", *_as_key(k_in)):
                raise ValueError(
                    f"{name}: the output state key for {_show(k_in)} must be "
                    f"{('next', *_as_key(k_in))!r}, got {k_out!r}. The env's step_mdp moves "
                    f"('next', key) to key between steps; any other name would feed the "
                    f"stored initial state back at every step and silently lose the memory."
                )
        return [*in_keys, IS_INIT_KEY], out_keys

    def _build_rnn(
        self,
        rnn: nn.Module | None,
        input_size: int | None,
        hidden_size: int | None,
        num_layers: int,
        bias: bool,
        dropout: float,
        proj_size: int,
        device: torch.device | str | None,
    ) -> nn.Module:
        name, arg = type(self).__name__, self._rnn_name
        if rnn is None:
            if input_size is None or hidden_size is None:
                raise ValueError(
                    f"{name}: input_size and hidden_size are required (or pass an existing "
                    f"module with {arg}=...), got input_size={input_size!r}, "
                    f"hidden_size={hidden_size!r}."
                )
            kwargs: dict[str, Any] = {"proj_size": proj_size} if proj_size else {}
            return self._torch_cls(input_size, hidden_size, num_layers, bias=bias,
                                   batch_first=True, dropout=dropout, device=device,
                                   **kwargs)  # fmt: skip
        given = {
            "input_size": input_size, "hidden_size": hidden_size,
            "num_layers": None if num_layers == 1 else num_layers,
            "bias": None if bias else bias, "dropout": dropout or None,
            "proj_size": proj_size or None,
        }  # fmt: skip
        clash = [k for k, v in given.items() if v is not None]
        if clash:
            raise ValueError(
                f"{name}: {arg}= wraps an existing module and is exclusive with the arguments "
                f"that build one; drop {clash} (they are read from the module)."
            )
        accepted = tuple(c for c in (self._torch_cls, self._python_cls) if c is not None)
        if not isinstance(rnn, accepted):
            names = " or ".join(f"{c.__module__}.{c.__name__}" for c in accepted)
            raise ValueError(f"{name}: {arg}= must be a {names}, got {type(rnn).__name__}.")
        if getattr(rnn, "bidirectional", False):
            raise ValueError(
                f"{name}: bidirectional networks cannot run one step at a time; pass a "
                f"module built with bidirectional=False."
            )
        if device is not None:
            rnn = rnn.to(device)
        return rnn

    @staticmethod
    def _convert(rnn: nn.Module, cls: type[nn.Module]) -> nn.Module:
        kwargs: dict[str, Any] = {}
        if getattr(rnn, "proj_size", 0):
            kwargs["proj_size"] = rnn.proj_size
        weight = next(rnn.parameters())
        new = cls(rnn.input_size, rnn.hidden_size, rnn.num_layers, bias=rnn.bias,
                  batch_first=True, dropout=rnn.dropout, device=weight.device,
                  dtype=weight.dtype, **kwargs)  # fmt: skip
        new.load_state_dict(rnn.state_dict())
        new.train(rnn.training)
        return new

    def _set_rnn(self, rnn: nn.Module, python_based: bool) -> None:
        setattr(self, self._rnn_name, rnn)
        self.python_based = python_based
        self._cfg = self.config
        self._step_shape_cache: dict[torch.Size, tuple[Any, ...]] = {}
        self._step_plan: StepPlan | None = None
        self._set_agent_networks(rnn)

    # ------------------------------------------------------------------ public API
    @property
    def rnn(self) -> nn.Module:
        """The wrapped ``nn.LSTM``/``nn.GRU`` (or its python-native twin)."""
        return getattr(self, self._rnn_name)

    @property
    def config(self) -> RNNConfig:
        """Static description of the wrapped network."""
        rnn = self.rnn
        proj = getattr(rnn, "proj_size", 0)
        return RNNConfig(self._mode, rnn.input_size, rnn.hidden_size, rnn.num_layers,
                         bool(rnn.bias), float(rnn.dropout), proj)  # fmt: skip

    @property
    def recurrent_mode(self) -> bool:
        """Whether this module runs in recurrent mode now (context, else its default)."""
        mode = _current()
        return self.default_recurrent_mode if mode is None else mode

    def set_recurrent_mode(self, mode: bool = True) -> None:
        """Removed: raises ``RuntimeError`` naming the replacement."""
        raise RuntimeError(
            f"{type(self).__name__}.set_recurrent_mode() was removed. Use the context manager "
            f"`with recurrl.modules.set_recurrent_mode(True): ...` (also a decorator), or "
            f"build the module with default_recurrent_mode=True."
        )

    @property
    def state_keys(self) -> list[NestedKey]:
        """The keys the stored state is read from."""
        return self.in_keys[1:-1]

    @property
    def recurrent_state_spec(self) -> dict[NestedKey, tuple[torch.Size, torch.dtype]]:
        """Shape (without batch dims) and dtype of every state key: ``[num_layers, S]``
        (``[n_agents, num_layers, S]`` with ``n_agents``)."""
        cfg = self.config
        dtype = next(self.rnn.parameters()).dtype
        agents = [] if self.n_agents is None else [self.n_agents]
        return {
            key: (torch.Size([*agents, cfg.num_layers, size]), dtype)
            for key, size in zip(self.state_keys, cfg.state_sizes, strict=True)
        }

    def make_tensordict_primer(self) -> Any:
        """A ``TensorDictPrimer`` that puts zero states in the env's TensorDicts on reset.

        Append it to the env (``env.append_transform(module.make_tensordict_primer())``) so
        that the state keys are part of the env's specs and ride from step to step.

        What :meth:`recurrl.envs.TensorDictPrimer.from_module` ``(self)`` returns: the module
        only describes its state (:attr:`recurrent_state_spec`) and the env layer, which
        registers its builder with :mod:`recurrl.modules` when it is imported, builds the
        transform (:mod:`recurrl.modules` never imports :mod:`recurrl.envs`).

        Raises:
            RuntimeError: :mod:`recurrl.envs` was never imported in this process.
        """
        caller = f"{type(self).__name__}.make_tensordict_primer()"
        return env_transform_builders(caller).primer(self)

    @property
    def canonical_keys(self) -> list[NestedKey]:
        """Keys whose memory layout matters to this module: its in_keys and out_keys."""
        return [*self.in_keys, *self.out_keys]

    def canonicalize(self, data: TensorDictBase, *, inplace: bool = False) -> TensorDictBase:
        """Make the leaves under :attr:`canonical_keys` contiguous, leaving the rest alone.

        Args:
            data: TensorDict to canonicalize; keys absent from it are skipped.
            inplace: mutate ``data`` and return it, instead of a shallow copy.
        """
        out = data if inplace else data.copy()
        for key in self.canonical_keys:
            value = data.get(key, None)
            if isinstance(value, Tensor) and not value.is_contiguous():
                out.set(key, value.contiguous())
        return out

    def _python_twin(self) -> type[nn.Module]:
        """``python_network_class``, or a ``ValueError`` saying the module has none."""
        if self._python_cls is None:
            raise ValueError(
                f"{type(self).__name__}: python_based=True runs the python-native twin of the "
                f"network, and this module declares none (python_network_class = None). Fix: "
                f"python_based=False, or declare python_network_class on the class."
            )
        return self._python_cls

    def make_python_based(self):
        """Swap the wrapped network for its python-native twin (same weights). Returns self."""
        if not self.python_based:
            self._set_rnn(self._convert(self.rnn, self._python_twin()), True)
        return self

    def make_cudnn_based(self):
        """Swap the wrapped network for torch's fused one (same weights). Returns self."""
        if self.python_based:
            self._set_rnn(self._convert(self.rnn, self._torch_cls), False)
        return self

    # ------------------------------------------------------------------ forward
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``nn.Module.__call__``: ``forward`` directly when nothing hooks in (no module or
        global hooks), the module is not compiled and no JIT trace runs, which is torch's own
        shortcut without its two Python frames (~2 µs of a ~50 µs acting step); anything
        else goes through ``nn.Module.__call__``."""
        if (
            _CALL_SHORTCUT
            and self._compiled_call_impl is None
            and not (
                self._forward_hooks
                or self._forward_pre_hooks
                or self._backward_hooks
                or self._backward_pre_hooks
                or any(_GLOBAL_HOOKS)
                or torch._C._get_tracing_state()
            )
        ):
            return self.forward(*args, **kwargs)
        out = nn.Module.__call__(self, *args, **kwargs)
        if isinstance(out, TensorDictBase) and self._out_keys_apparent != self._out_keys:
            # select_out_keys: tensordict's hook drops the unselected outputs, except (in
            # tensordict < 0.15) when a state key is missing from the input, which it takes
            # for a keyword call; drop them here too, whatever the version
            dropped = [k for k in self._out_keys if k not in self._out_keys_apparent]
            out = out.exclude(*dropped, inplace=True)
        return out

    def forward(
        self, tensordict: TensorDictBase | Tensor | None = None, *args: Tensor, **kwargs: Any
    ) -> TensorDictBase | Tensor | tuple[Tensor, ...]:
        """Read the input, state and ``is_init``; write the output and ``("next", state)``.

        Called with a TensorDict, writes into it and returns it. Called with tensors, as
        ``tensordict.nn`` modules allow (``module(obs=x, is_init=m, recurrent_state_h=h,
        recurrent_state_c=c)``: keywords named after the ``in_keys``, a nested key's parts
        joined with ``"_"``; or positionally, in ``in_keys`` order), builds a TensorDict whose
        batch dims are the input's leading dims, runs, and returns the ``out_keys`` entries:
        one tensor if there is one key, else a tuple in ``out_keys`` order. Missing state
        keywords follow the missing-state rule below; an unknown keyword raises ``TypeError``.

        Shapes: sequential mode ``x [*B, F]``, states ``[*B, num_layers, S]``, ``is_init
        [*B, 1]``; recurrent mode the same with a time dim ``T`` last among the batch dims.

        Dtypes: ``x`` has the parameters' dtype (another one raises ``TypeError``: cast the
        input or the module); ``is_init`` is bool, or 0/1 integers, which are cast (other
        values raise ``ValueError``, a floating ``is_init`` raises ``TypeError``); stored
        states of another floating dtype are cast to the input's.

        A missing state key is read as zeros when every row starts an episode there
        (sequential: ``is_init`` True; recurrent: ``is_init`` True at the row's first step),
        and raises ``KeyError`` otherwise.
        """
        mode = _current()  # self.recurrent_mode, inlined: this runs at every env step
        recurrent = self.default_recurrent_mode if mode is None else mode
        if self.n_agents is not None:
            return self._forward_agents(tensordict, recurrent)
        if type(tensordict) is TensorDict and not recurrent and self._step_shortcuts:
            # the usual sequential call: the fast path, unless it declines
            out = fast_step(self, tensordict)
            if out is not None:
                return out
            return self._step_checked(tensordict)
        if tensordict is None or isinstance(tensordict, Tensor):
            return self._forward_tensors(tensordict, args, kwargs)
        if recurrent:
            return self._forward_sequence(tensordict)
        return self._forward_step(tensordict)

    def _current_config(self) -> RNNConfig:
        # Sizes cannot change without new weights, but dropout is a plain attribute of the
        # wrapped module: refresh the cached config if it was edited after construction.
        # _modules[...]: the network without nn.Module.__getattr__ (this runs every step)
        if self._cfg.dropout != self._modules[self._rnn_name].dropout:
            self._cfg = self.config
        return self._cfg

    def _flat_weights(self) -> list[Tensor]:
        rnn = self._modules[self._rnn_name]
        return rnn.flat_weights if self.python_based else rnn._flat_weights

    def _runner(self):
        rnn = self.rnn
        if not self.python_based:
            return fused_runner(self._current_config(), rnn._flat_weights, self.training)
        return python_runner(rnn, self._cfg.kind.num_states > 1)

    #: False runs every sequential step through the validating readers (the oracle the
    #: shortcuts are tested against): no fast path, no usual-input shortcut in _read_step
    _step_shortcuts: ClassVar[bool] = True

    def _step_shapes(self, batch: torch.Size) -> tuple[Any, ...]:
        """Expected shapes of one step's input, ``is_init`` and states for ``batch``, cached
        (they depend on the batch and the network sizes only)."""
        shapes = self._step_shape_cache.get(batch)
        if shapes is None:
            cfg = self._cfg
            shapes = (
                (*batch, cfg.input_size),
                (*batch, 1),
                tuple((*batch, cfg.num_layers, size) for size in cfg.state_sizes),
                batch.numel(),
            )
            self._step_shape_cache[batch] = shapes
        return shapes

    def _read_step(
        self, td: TensorDictBase, batch: torch.Size, dtype: torch.dtype
    ) -> tuple[Tensor, ...]:
        """Input ``[N, F]``, ``is_init`` ``[N]`` and states ``[N, L, S]`` of one step, with the
        batch dims ``[*B]`` flattened to ``N``; ``dtype`` is the parameters'.

        The usual case (every key present, with the expected shape and dtype) is recognised
        with a few comparisons; anything else goes through the validating readers, which
        convert what they can and raise naming the key otherwise. Both give the same values.
        """
        x_shape, init_shape, state_shapes, n = self._step_shapes(batch)
        x = td.get(self.in_keys[0], None)
        is_init = td.get(IS_INIT_KEY, None)
        states = tuple(td.get(key, None) for key in self.in_keys[1:-1])
        usual = (
            self._step_shortcuts
            and x is not None
            and is_init is not None
            and x.shape == x_shape
            and x.dtype == dtype
            and is_init.shape == init_shape
            and is_init.dtype == torch.bool
            and all(
                s is not None and s.shape == shape and s.dtype == x.dtype
                for s, shape in zip(states, state_shapes, strict=True)
            )
        )
        if not usual:
            x = self._read_input(td, batch, dtype)
            is_init = self._read_is_init(td, batch)
            states = self._read_states(td, batch, x, is_init)
        if len(batch) != 1:  # the collector's [N] batches need no reshaping
            x = x.reshape(n, x.shape[-1])
            states = tuple(s.reshape(n, *s.shape[-2:]) for s in states)
        return x, is_init.reshape(n), *states

    def _forward_step(self, td: TensorDictBase) -> TensorDictBase:
        # the usual call (a plain TensorDict with the expected entries) takes the fast path;
        # anything else, or a fast path that declines, the checked one
        if type(td) is TensorDict and self._step_shortcuts:
            out = fast_step(self, td)
            if out is not None:
                return out
        return self._step_checked(td)

    def _step_checked(self, td: TensorDictBase) -> TensorDictBase:
        """The sequential step through the readers that convert and check every entry."""
        batch = td.batch_size
        weights = self._flat_weights()
        x, is_init, *states = self._read_step(td, batch, weights[0].dtype)
        flat = len(batch) == 1
        cpp_step = step_plan(self).cpp_step  # recurrent_backend="cpp": the fast path's step
        out = None if cpp_step is None else cpp_step(x, states, is_init, weights)
        if out is not None:
            y, new_states = out
        else:
            y, new_states = self._cells_step(x, is_init, states, weights)
        td.set(self.out_keys_source[0], y if flat else y.reshape(*batch, y.shape[-1]))
        for key, s in zip(self.out_keys_source[1:], new_states, strict=True):
            td.set(key, s if flat else s.reshape(*batch, *s.shape[-2:]))
        return td

    def _cells_step(
        self, x: Tensor, is_init: Tensor, states: list[Tensor], weights: list[Tensor]
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One step of torch's (or the python-native) cells on ``[N, L, S]`` states, the
        reset applied first."""
        # Skipping the reset when nothing restarts is free on CPU; elsewhere it would cost a
        # device synchronisation per step, so the masking always runs there.
        if not is_init.is_cpu or bool(is_init.any()):
            reset = is_init.view(-1, 1, 1)
            states = [s.masked_fill(reset, 0) for s in states]
        return recurrent_step(
            self._current_config(),
            weights,
            x,
            tuple(states),
            training=self.training,
            python_based=self.python_based,
        )

    def _forward_sequence(self, td: TensorDictBase) -> TensorDictBase:
        batch = td.batch_size
        if not batch:
            raise ValueError(
                f"{type(self).__name__} in recurrent mode needs a time dimension (the last "
                f"batch dim), got a TensorDict with batch_size []. Give it [T] or [*B, T] "
                f"data, or run it outside set_recurrent_mode(True) for a single step."
            )
        weights = self._flat_weights()
        x = self._read_input(td, batch, weights[0].dtype)
        is_init = self._read_is_init(td, batch)
        states = self._read_states(td, batch, x, is_init[..., 0] if batch[-1] else is_init)
        steps = batch[-1]
        n = batch.numel() // steps if steps else 0
        y, new_states = recurrent_unroll(
            self._current_config(),
            weights,
            x.reshape(n, steps, x.shape[-1]),
            tuple(s.reshape(n, steps, *s.shape[-2:]) for s in states),
            is_init.reshape(n, steps),
            options=self._recurrent_options,
            training=self.training,
            python_based=self.python_based,
            runner=self._runner() if self.python_based else None,
        )
        td.set(self.out_keys_source[0], y.reshape(*batch, y.shape[-1]))
        for key, s in zip(self.out_keys_source[1:], new_states, strict=True):
            td.set(key, s.reshape(*batch, *s.shape[-2:]))
        return td

    def extra_repr(self) -> str:
        return (
            f"in_keys={self.in_keys}, out_keys={self.out_keys}, python_based="
            f"{self.python_based}, recurrent_backend={self.recurrent_backend!r}"
        )
