"""Reset-aware unrolling of stacked recurrent layers over ``[N, T]`` batches.

Semantics shared by every backend (the recurrent-mode contract of recurrl):

* each row starts from the state stored at its first step;
* wherever ``is_init[n, t]`` is True (``t > 0``) the row restarts from the state stored at
  ``t`` instead of carrying its own;
* the returned states are exact at every trajectory end (the step before a restart, and the
  last step) and zero at every other step, so all backends return identical tensors.

Backends (:data:`RECURRENT_BACKEND_REGISTRY`): ``"pad"`` (split at resets, torch's fused
kernels), ``"scan"`` (time loop with ``where``), ``"triton"`` (GPU kernel; see
:func:`triton_unavailable_reason`), ``"assoc"`` (reset-aware parallel scan, linear-recurrent
cells only), ``"cpp"`` (scan's fused loops in C++, CPU, compiled on first use, see
:mod:`~recurrl.functional.recurrent.cpp`) and ``"auto"``, the default everywhere, which picks
one of them for the input (:func:`resolve_backend`). Cells
(:mod:`~recurrl.functional.recurrent.cell`): ``"lstm"``, ``"gru"``, ``"mingru"``
(:mod:`~recurrl.functional.recurrent.linear_cells`), ``"lru"``
(:mod:`~recurrl.functional.recurrent.lru`) and any registered kind; each backend
declares the kinds it runs and refuses the others by name.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from recurrl import _ext
from recurrl.functional.precision import validate_recurrent_matmul_precision
from recurrl.functional.recurrent.assoc import assoc_refuses, assoc_unroll
from recurrl.functional.recurrent.cell import (
    CELL_KINDS,
    CellKind,
    get_cell_kind,
    register_cell_kind,
)
from recurrl.functional.recurrent.config import LayerWeights, RNNConfig
from recurrl.functional.recurrent.cpp import (
    CPP_DTYPES,
    CPP_LAYERS,
    cpp_check,
    cpp_refuses,
    cpp_unroll,
)
from recurrl.functional.recurrent.cpp_linear import CPP_LINEAR_LAYERS  # noqa: F401 (cpp layers)
from recurrl.functional.recurrent.linear_cells import LinearCellKind
from recurrl.functional.recurrent.lru import LRUKind  # registers "lru"
from recurrl.functional.recurrent.pad import Runner, fused_runner, pad_unroll
from recurrl.functional.recurrent.scan import scan_unroll
from recurrl.functional.recurrent.step import recurrent_step
from recurrl.functional.recurrent.triton import (
    TRITON_CELLS,
    TritonLaunch,
    triton_config_error,
    triton_launch,
    triton_unavailable_reason,
    triton_unroll,
)
from recurrl.functional.sequences import trajectory_ends

__all__ = [
    "AUTO_TRITON_MIN_ROWS",
    "CELL_KINDS",
    "RECURRENT_BACKENDS",
    "RECURRENT_BACKEND_REGISTRY",
    "RECURRENT_RECOMPUTE",
    "CellKind",
    "LRUKind",
    "LayerWeights",
    "LinearCellKind",
    "RNNConfig",
    "RecurrentBackend",
    "RecurrentOptions",
    "Runner",
    "TritonLaunch",
    "auto_picks_triton",
    "auto_step_runs_cpp",
    "backend_refusal",
    "check_recurrent_options",
    "fused_runner",
    "get_cell_kind",
    "recurrent_backend_names",
    "recurrent_step",
    "recurrent_unroll",
    "register_cell_kind",
    "register_recurrent_backend",
    "resolve_backend",
    "triton_launch",
    "triton_unavailable_reason",
]

RecurrentBackendName = Literal["pad", "scan", "triton", "assoc", "cpp", "auto"]
RecurrentRecompute = Literal["none", "full"]
#: The built-in backend names (``"auto"`` picks one of the others).
RECURRENT_BACKENDS: tuple[str, ...] = ("pad", "scan", "triton", "assoc", "cpp", "auto")
#: The ``recurrent_recompute`` values: ``"none"`` keeps the unroll's activations for the
#: backward pass, ``"full"`` recomputes them there (less memory; not every backend can).
RECURRENT_RECOMPUTE: tuple[str, ...] = ("none", "full")
_COMPUTE_DTYPES = (torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class RecurrentOptions:
    """How recurrent mode runs, validated once and forwarded unchanged by the modules.

    Attributes:
        backend: ``"auto"`` (the default: the fastest registered backend that runs the
            input, see :func:`resolve_backend`), or a name of
            :data:`RECURRENT_BACKEND_REGISTRY`: ``"pad"``, ``"scan"``, ``"triton"``,
            ``"assoc"``, ``"cpp"`` or one registered by the user
            (:func:`recurrent_backend_names` lists them).
        recompute: ``"none"``, or ``"full"`` (recompute activations in backward;
            ``scan``/``triton``/``assoc``/``cpp``).
        compute_dtype: for ``triton``, the dtype of the recurrent matmul's operands
            (``torch.float32`` or ``torch.bfloat16``); other backends ignore it.
        matmul_precision: for ``triton``, a :mod:`recurrl.functional.precision` mode for
            float32 operands (stored as its string value); other backends ignore it.

    Examples:
        >>> RecurrentOptions("scan", "full").recompute
        'full'
        >>> RecurrentOptions("pad", "full")
        Traceback (most recent call last):
        ...
        ValueError: recurrent_recompute='full' is not available with recurrent_backend='pad'...
    """

    backend: RecurrentBackendName | str = "auto"
    recompute: RecurrentRecompute = "none"
    compute_dtype: torch.dtype = torch.float32
    matmul_precision: str = "auto"

    def __post_init__(self) -> None:
        names = recurrent_backend_names()
        if self.backend not in names:
            raise ValueError(
                f"recurrent_backend must be one of {names}, got {self.backend!r}. Fix: "
                f"recurrent_backend='auto', or register_recurrent_backend(...) your own first."
            )
        if self.recompute not in RECURRENT_RECOMPUTE:
            raise ValueError(
                f"recurrent_recompute must be one of {RECURRENT_RECOMPUTE}, got {self.recompute!r}."
            )
        backend = RECURRENT_BACKEND_REGISTRY.get(self.backend)
        if backend is not None and self.recompute != "none" and not backend.recompute:
            raise ValueError(
                f"recurrent_recompute='full' is not available with recurrent_backend="
                f"{self.backend!r}: {backend.no_recompute_reason} Use recurrent_backend='scan' "
                f"with recompute, or recurrent_recompute='none'."
            )
        if self.compute_dtype not in _COMPUTE_DTYPES:
            raise ValueError(
                f"recurrent_compute_dtype must be one of {_COMPUTE_DTYPES}, got "
                f"{self.compute_dtype!r}."
            )
        precision = validate_recurrent_matmul_precision(self.matmul_precision).value
        object.__setattr__(self, "matmul_precision", precision)


class UnrollFn(Protocol):
    """``unroll(cfg, flat_weights, x, states, is_init, options, *, training, python_based,
    runner) -> (y [N, T, O], states)``: one signature for every backend."""

    def __call__(
        self,
        cfg: RNNConfig,
        flat_weights: Sequence[Tensor],
        x: Tensor,
        states: tuple[Tensor, ...],
        is_init: Tensor,
        options: RecurrentOptions,
        *,
        training: bool,
        python_based: bool,
        runner: Runner | None,
    ) -> tuple[Tensor, tuple[Tensor, ...]]: ...


@dataclass(frozen=True)
class RecurrentBackend:
    """One entry of :data:`RECURRENT_BACKEND_REGISTRY`.

    Attributes:
        name: the ``recurrent_backend`` string.
        unroll: the implementation (:class:`UnrollFn`).
        refuses: ``refuses(kind, python_based) -> reason | None``: why the backend cannot run
            a cell kind (checked when a module is built and at every call).
        per_step_states: the unroll returns the state after every step;
            :func:`recurrent_unroll` keeps the trajectory ends (zero elsewhere) once for all.
        recompute: whether ``recompute="full"`` means something here.
        no_recompute_reason: said when recompute is asked of a backend that cannot.
        check: ``check(options, python_based, device, cfg) -> None``, extra checks raised at
            construction (e.g. ``triton``'s availability), or ``None``.
        summary: one line saying what the backend is, for the generated tables of the
            documentation (``docs/guides/recurrent_mode.md``).
    """

    name: str
    unroll: UnrollFn
    refuses: Callable[[CellKind, bool], str | None]
    per_step_states: bool = True
    recompute: bool = True
    no_recompute_reason: str = ""
    check: Callable[..., None] | None = None
    summary: str = ""


#: Every backend by name; ``"auto"`` is resolved by :func:`resolve_backend` before lookup.
RECURRENT_BACKEND_REGISTRY: dict[str, RecurrentBackend] = {}


def register_recurrent_backend(
    backend: RecurrentBackend, *, replace: bool = False
) -> RecurrentBackend:
    """Make ``backend`` selectable as ``recurrent_backend=backend.name``; returns it."""
    if backend.name == "auto":
        raise ValueError("'auto' is not a backend but the choice of one; pick another name.")
    if backend.name in RECURRENT_BACKEND_REGISTRY and not replace:
        raise ValueError(
            f"recurrent backend {backend.name!r} is already registered. Pick another name, "
            f"or pass replace=True."
        )
    RECURRENT_BACKEND_REGISTRY[backend.name] = backend
    return backend


def recurrent_backend_names() -> tuple[str, ...]:
    """Every value ``recurrent_backend`` accepts: the registered backends, then ``"auto"``.

    The one list of backend names: module arguments, :class:`RecurrentOptions`, the trainer's
    ``--recurrent-backend`` and the sweep's ``--backends`` all read it, so a backend added by
    :func:`register_recurrent_backend` is accepted everywhere.

    Examples:
        >>> recurrent_backend_names()[-1]
        'auto'
        >>> "cpp" in recurrent_backend_names()
        True
    """
    return (*RECURRENT_BACKEND_REGISTRY, "auto")


def backend_refusal(backend: str, mode: str, *, python_based: bool = False) -> str | None:
    """Why the registered ``backend`` cannot run the cell kind ``mode`` (``None`` if it can,
    and for ``"auto"``, which only picks backends that run the kind).

    Examples:
        >>> backend_refusal("assoc", "lstm") is not None  # a parallel scan: linear cells only
        True
        >>> backend_refusal("auto", "lstm") is None
        True
    """
    entry = RECURRENT_BACKEND_REGISTRY.get(backend)
    if entry is None:
        return None
    return _refusal(entry, get_cell_kind(mode), python_based)


def _refusal(backend: RecurrentBackend, kind: CellKind, python_based: bool) -> str | None:
    reason = backend.refuses(kind, python_based)
    if reason is None:
        return None
    runs = [
        name
        for name, other in RECURRENT_BACKEND_REGISTRY.items()
        if other.refuses(kind, python_based) is None
    ]
    return (
        f"recurrent_backend={backend.name!r} does not run the {kind.name!r} cell: {reason} "
        f"Backends that do: {runs}."
    )


def check_recurrent_options(
    backend: str,
    recompute: str,
    *,
    python_based: bool,
    device: torch.device | str | None = None,
    proj_size: int = 0,
    mode: str | None = None,
    compute_dtype: torch.dtype = torch.float32,
    matmul_precision: str = "auto",
) -> RecurrentOptions:
    """Validate a backend configuration and return it as :class:`RecurrentOptions`, raising
    ``ValueError`` (or ``ImportError``/``RuntimeError`` for an unusable ``"triton"``) with
    what to change.

    ``mode`` (the cell kind, e.g. ``"gru"``) is checked against what the backend runs.

    Examples:
        >>> check_recurrent_options("scan", "full", python_based=False).backend
        'scan'
        >>> check_recurrent_options("pad", "full", python_based=False)
        Traceback (most recent call last):
        ...
        ValueError: recurrent_recompute='full' is not available with recurrent_backend='pad'...
    """
    options = RecurrentOptions(backend, recompute, compute_dtype, matmul_precision)  # type: ignore[arg-type]
    kind = get_cell_kind(mode) if mode is not None else None
    entry = RECURRENT_BACKEND_REGISTRY.get(backend)
    if entry is None:  # "auto" picks only backends that run the kind and the options
        return options
    if kind is not None:
        reason = _refusal(entry, kind, python_based)
        if reason is not None:
            raise ValueError(reason)
    if entry.check is not None:
        # a linear-recurrent cell is python-native by construction, not by request: its
        # python_based=True asks nothing of the backend
        if isinstance(kind, LinearCellKind):
            python_based = False
        entry.check(options, python_based=python_based, device=device, proj_size=proj_size)
    return options


def resolve_backend(
    backend: str,
    x: Tensor,
    *,
    python_based: bool,
    mode: str = "lstm",
    is_init: Tensor | None = None,
    proj_size: int = 0,
    recompute: bool = False,
) -> str:
    """The concrete backend ``"auto"`` stands for on this input (others map to themselves).

    ``auto`` picks ``scan`` under ``torch.compile``/``vmap`` and for python-based modules
    (it is the only backend without data-dependent shapes), and ``pad`` on CUDA (cuDNN).
    On CPU, for float32/float64 inputs, where recurrl's C++ kernels build (compiled on first
    use), it picks ``cpp``, their fused loop: for the GRU always (0.3-0.7x the cost of
    torch's own GRU, whose kernel pays a large fixed cost per time step), for the LSTM when
    some row restarts inside the batch or ``recompute`` is asked (1.2-1.3x plain
    ``nn.LSTM`` against ``pad``'s 1.5-2x), and ``pad`` for an LSTM batch without a restart
    inside a row, which is one call of oneDNN's fused LSTM. Where the kernels do not build,
    or for other dtypes or a projection, the LSTM gets ``pad`` and the GRU ``scan`` (one
    warning says why the kernels are missing). A linear-recurrent cell gets ``cpp`` on CPU
    (2.5-3x faster than its parallel scan there) and ``assoc`` (the parallel scan) on other
    devices and where the kernels do not build; any other cell without a fused sequence
    operator gets ``scan``. With ``recompute`` it never picks ``pad`` (torch's fused kernels
    keep their own activations): ``scan`` runs where ``pad`` would.
    On CUDA, given ``is_init``, ``auto`` picks ``triton`` where it was measured to beat
    ``pad`` (see :func:`auto_picks_triton`): an LSTM/GRU without projection, float32, at
    least :data:`AUTO_TRITON_MIN_ROWS` rows, with a restart inside some row (without one,
    ``pad`` is a single cuDNN call), and the ``triton`` package installed. The figures
    behind these choices are in ``benchmarks/README.md``.

    Examples:
        >>> import torch
        >>> resolve_backend("auto", torch.zeros(1, device="meta"), python_based=False,
        ...                 mode="gru")  # off CPU and CUDA; on CPU 'cpp' where it builds
        'scan'
        >>> resolve_backend("pad", torch.zeros(1), python_based=True)
        'pad'
        >>> resolve_backend("auto", torch.zeros(1, device="meta"), python_based=False,
        ...                 mode="mingru")  # off CPU; on CPU 'cpp' where a compiler is found
        'assoc'
    """
    if backend != "auto":
        return backend
    if torch.compiler.is_compiling() or torch._C._functorch.is_batchedtensor(x):
        return "scan"
    kind = get_cell_kind(mode)
    if isinstance(kind, LinearCellKind):  # python_based asks nothing of these cells
        return "cpp" if _auto_runs_cpp(kind, x.device, x.dtype, "assoc") else "assoc"
    if python_based:
        return "scan"
    if not kind.has_fused_sequence:
        return "scan"
    if (
        x.device.type == "cuda"
        and is_init is not None
        and auto_picks_triton(mode, x, is_init, proj_size=proj_size)
    ):
        return "triton"
    fallback = "pad" if x.device.type == "cuda" else _cpu_fallback(kind)
    if recompute and fallback == "pad":
        fallback = "scan"  # pad keeps torch's own activations: it cannot recompute
    if (
        x.device.type == "cpu"
        and not proj_size
        and (
            not kind.auto_pad_on_cpu  # the GRU: cpp on every batch
            or recompute  # pad cannot recompute, cpp can
            or is_init is None
            or _restarts_inside(is_init)  # the LSTM: pad is one fused call without them
        )
        and _auto_runs_cpp(kind, x.device, x.dtype, fallback)
    ):
        return "cpp"
    return fallback


def _cpu_fallback(kind: CellKind) -> str:
    """What ``auto`` runs an LSTM/GRU-like ``kind`` by on CPU where ``cpp`` does not run it:
    ``pad`` where the kind asks for it (oneDNN's fused LSTM), else ``scan``."""
    return "pad" if kind.auto_pad_on_cpu else "scan"


def _restarts_inside(is_init: Tensor) -> bool:
    """Whether some row of ``is_init [..., T]`` restarts after its first step."""
    return is_init.shape[-1] > 1 and bool(is_init[..., 1:].any())


_warned_no_cpp = False


def _auto_runs_cpp(kind: CellKind, device: torch.device, dtype: torch.dtype, fallback: str) -> bool:
    """Whether ``auto`` runs the cell ``kind`` on tensors of ``device`` and ``dtype`` by
    ``cpp``: on CPU, in a dtype the kernels run, where recurrl's C++ kernels load (built the
    first time). Where they cannot be built ``auto`` runs ``fallback`` and says so once per
    process."""
    global _warned_no_cpp
    if device.type != "cpu" or dtype not in CPP_DTYPES or kind.name not in CPP_LAYERS:
        return False
    failure = _ext.try_load_extension()
    if failure is None:
        return True
    if not _warned_no_cpp:
        _warned_no_cpp = True
        warnings.warn(
            f"recurrent_backend='auto' runs the {kind.name!r} cell on CPU by {fallback!r} "
            f"instead of 'cpp' (recurrl's C++ loop, the faster one there): "
            f"{failure.splitlines()[0]} Fix: install a C++ compiler and ninja for the faster "
            f"loop, or pass recurrent_backend={fallback!r} to choose it and silence this "
            f"warning.",
            stacklevel=3,
        )
    return False


def auto_step_runs_cpp(
    mode: str, device: torch.device, dtype: torch.dtype, *, python_based: bool = False
) -> bool:
    """Whether a module with ``recurrent_backend="auto"`` steps (sequential mode) a one-layer
    ``mode`` cell without projection by the ``cpp`` backend's C++ step
    (:mod:`~recurrl.functional.recurrent.cpp_step`): on CPU, float32/float64, an LSTM or GRU,
    where recurrl's C++ kernels load; the numbers of one step of the ``cpp`` recurrent mode,
    which ``auto`` runs on the same module's batches with restarts.

    Examples:
        >>> import torch
        >>> auto_step_runs_cpp("gru", torch.device("meta"), torch.float32)  # CPU only
        False
    """
    from recurrl.functional.recurrent.cpp_step import CPP_STEPS

    if python_based or mode not in CPP_STEPS or torch.compiler.is_compiling():
        return False
    kind = get_cell_kind(mode)
    return _auto_runs_cpp(kind, torch.device(device), dtype, _cpu_fallback(kind))


#: The fewest rows (``N``) for which ``auto`` picks ``triton`` on CUDA: the smallest batch
#: measured (one block of 16 rows, its hidden units split over column groups), where the
#: kernel beat ``pad`` 3-7x at every restart rate on an H200 (``benchmarks/README.md``).
AUTO_TRITON_MIN_ROWS = 16


def auto_picks_triton(mode: str, x: Tensor, is_init: Tensor, *, proj_size: int = 0) -> bool:
    """Whether ``auto`` runs this batch with ``triton`` (on a CUDA device).

    True for an LSTM/GRU without projection on float32 inputs of at least
    :data:`AUTO_TRITON_MIN_ROWS` rows with a restart inside some row, when the ``triton``
    package is installed. Looking for a restart reads one flag back from the device (``pad``
    reads the restarts anyway).

    Examples:
        >>> import torch
        >>> x, is_init = torch.zeros(128, 8, 3), torch.zeros(128, 8, dtype=torch.bool)
        >>> auto_picks_triton("lstm", x, is_init)  # no restart inside a row: cuDNN in one call
        False
    """
    if mode not in TRITON_CELLS or proj_size or x.dtype != torch.float32:
        return False
    if x.dim() < 3 or x.shape[0] < AUTO_TRITON_MIN_ROWS or is_init.shape[-1] < 2:
        return False
    if _triton_missing():
        return False
    return bool(is_init[:, 1:].any())


@functools.cache
def _triton_missing() -> bool:
    return importlib.util.find_spec("triton") is None


def recurrent_unroll(
    cfg: RNNConfig,
    flat_weights: Sequence[Tensor],
    x: Tensor,
    states: tuple[Tensor, ...],
    is_init: Tensor,
    *,
    options: RecurrentOptions | None = None,
    backend: str | None = None,
    training: bool = False,
    recompute: str | None = None,
    python_based: bool = False,
    runner: Runner | None = None,
    compute_dtype: torch.dtype | None = None,
    matmul_precision: str | None = None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Run a stacked recurrent network over ``[N, T]`` sequences with resets.

    Args:
        cfg: the network description (its ``mode`` names the cell kind).
        flat_weights: parameters in ``torch.nn.LSTM._flat_weights`` order.
        x: ``[N, T, F]`` inputs.
        states: stored states, each ``[N, T, L, S]`` (``(h, c)`` for the LSTM, ``(h,)`` for
            the GRU).
        is_init: ``[N, T]`` bool restart flags.
        options: a :class:`RecurrentOptions` (backend, recompute, compute dtype, matmul
            precision). The separate keywords below are the same settings, for calls that
            do not build one; give one or the other.
        backend: one of :func:`recurrent_backend_names` (default ``"auto"``).
        training: enables inter-layer dropout.
        recompute: ``"none"`` (default) or ``"full"`` (recompute activations in backward).
        python_based: use only python-native torch ops (no fused torch RNN kernels).
        runner: for ``pad``, the multi-layer call to run on the pieces (defaults to torch's
            fused kernels through :func:`fused_runner`).
        compute_dtype: for ``triton``, the dtype of the recurrent matmul's operands
            (``torch.float32`` or ``torch.bfloat16``); other backends ignore it.
        matmul_precision: for ``triton``, a :mod:`recurrl.functional.precision` mode for
            float32 operands; other backends ignore it.

    Returns:
        ``(y, next_states)``: ``y`` is ``[N, T, O]``; each next state is ``[N, T, L, S]``,
        exact at every trajectory end and zero elsewhere.

    Examples:
        >>> import torch
        >>> lstm = torch.nn.LSTM(3, 4, batch_first=True)
        >>> cfg = RNNConfig("lstm", 3, 4)
        >>> x = torch.randn(2, 5, 3)
        >>> h, c = torch.zeros(2, 5, 1, 4), torch.zeros(2, 5, 1, 4)
        >>> is_init = torch.zeros(2, 5, dtype=torch.bool)
        >>> y, (h1, c1) = recurrent_unroll(cfg, lstm._flat_weights, x, (h, c), is_init)
        >>> torch.allclose(y, lstm(x)[0], atol=1e-6)
        True
    """
    separate = {
        "backend": backend, "recompute": recompute, "compute_dtype": compute_dtype,
        "matmul_precision": matmul_precision,
    }  # fmt: skip
    given = {k: v for k, v in separate.items() if v is not None}
    if options is None:
        options = RecurrentOptions(**given) if given else _DEFAULT_OPTIONS
    elif given:
        raise TypeError(
            f"recurrent_unroll: pass the settings either as options=RecurrentOptions(...) or "
            f"as keywords, not both (received options= and {sorted(given)})."
        )
    name = resolve_backend(
        options.backend, x, python_based=python_based, mode=cfg.mode, is_init=is_init,
        proj_size=cfg.proj_size, recompute=options.recompute != "none",
    )  # fmt: skip
    entry = RECURRENT_BACKEND_REGISTRY[name]
    reason = _refusal(entry, cfg.kind, python_based)
    if reason is not None:
        raise ValueError(reason)
    y, new_states = entry.unroll(
        cfg, flat_weights, x, states, is_init, options,
        training=training, python_based=python_based, runner=runner,
    )  # fmt: skip
    if entry.per_step_states:
        new_states = _at_ends(new_states, is_init)
    return y, new_states


def _at_ends(states: tuple[Tensor, ...], is_init: Tensor) -> tuple[Tensor, ...]:
    """Each state ``[N, T, L, S]`` kept at the trajectory ends and zero elsewhere.

    Selected rather than multiplied by a 0/1 mask: inside a trajectory that went non-finite
    ``0 * NaN`` would leave NaN where the contract promises zeros.
    """
    ends = trajectory_ends(is_init)
    eager = not (torch.compiler.is_compiling() or torch._C._functorch.is_batchedtensor(ends))
    if eager and ends.device.type == "cpu":
        # ends are sparse (one a trajectory): zeros and a copy of the end rows, 0.12 ms
        # against where()'s 0.7-0.9 ms at N=16, T=1024, H=64 on one thread; the indices cost
        # a host sync elsewhere, and a data-dependent shape under compile/vmap
        rows = ends.nonzero(as_tuple=True)
        if 8 * rows[0].numel() <= ends.numel():
            return tuple(_copy_rows(s, rows) for s in states)
    end = ends[..., None, None]
    # where() with a 0-dim zero: one pass, no negated mask (masked_fill of the broadcast
    # mask measured ~1.5x its cost at T=1024)
    return tuple(torch.where(end, s, s.new_zeros(())) for s in states)


def _copy_rows(s: Tensor, rows: tuple[Tensor, Tensor]) -> Tensor:
    """Zeros shaped as ``s [N, T, ...]`` holding ``s``'s entries at ``rows`` (indices of
    ``(n, t)``); differentiable in ``s``."""
    out = s.new_zeros(s.shape)
    out[rows] = s[rows]
    return out


# ---------------------------------------------------------------------- built-in backends
def _pad(cfg, flat_weights, x, states, is_init, options, *, training, python_based, runner):
    if options.recompute != "none":
        raise ValueError(
            f"recurrent_unroll(backend={options.backend!r}, recompute={options.recompute!r}): "
            f"the backend runs as 'pad' here, whose fused kernels cannot recompute. Use "
            f"backend='scan' with recompute, or recompute='none'."
        )
    if python_based and runner is None:
        raise ValueError(
            "recurrent_unroll(backend='pad', python_based=True) needs runner= (a call of "
            "the python-native network on the pieces); without it the pad backend would "
            "run torch's fused kernels. Pass runner=..., or use backend='scan'."
        )
    fused = runner is None
    run = runner if not fused else fused_runner(cfg, flat_weights, training)
    return pad_unroll(
        cfg, x, states, is_init, run, fused_weights=flat_weights if fused else None,
        training=training,
    )  # fmt: skip


def _pad_refuses(kind: CellKind, python_based: bool) -> str | None:
    if python_based or kind.has_fused_sequence:
        return None
    return "it runs torch's fused sequence operator, which this cell has none of."


def _scan(cfg, flat_weights, x, states, is_init, options, *, training, python_based, runner):
    return scan_unroll(
        cfg, flat_weights, x, states, is_init, training=training,
        recompute=options.recompute == "full", python_based=python_based,
    )  # fmt: skip


def _assoc(cfg, flat_weights, x, states, is_init, options, *, training, python_based, runner):
    return assoc_unroll(
        cfg, flat_weights, x, states, is_init, training=training,
        recompute=options.recompute == "full",
    )  # fmt: skip


def _triton(cfg, flat_weights, x, states, is_init, options, *, training, python_based, runner):
    return triton_unroll(
        cfg, flat_weights, x, states, is_init, training=training,
        recompute=options.recompute == "full", compute_dtype=options.compute_dtype,
        matmul_precision=options.matmul_precision,
    )  # fmt: skip


def _cpp(cfg, flat_weights, x, states, is_init, options, *, training, python_based, runner):
    return cpp_unroll(
        cfg, flat_weights, x, states, is_init, training=training,
        recompute=options.recompute == "full",
    )  # fmt: skip


def _triton_refuses(kind: CellKind, python_based: bool) -> str | None:
    if kind.name in TRITON_CELLS:
        return None
    return f"its GPU kernels are written for {sorted(TRITON_CELLS)} only."


def _triton_check(options, *, python_based, device, proj_size) -> None:
    if python_based:
        raise ValueError(
            "python_based=True cannot be honoured with recurrent_backend='triton' (a fused "
            "GPU kernel). Use recurrent_backend='scan' for a python-native recurrent mode."
        )
    if proj_size:
        raise ValueError(triton_config_error(proj_size))
    reason = triton_unavailable_reason(device)
    if reason is not None:
        error = ImportError if "not installed" in reason else RuntimeError
        raise error(reason)


register_recurrent_backend(
    RecurrentBackend(
        "pad", _pad, _pad_refuses, per_step_states=False, recompute=False,
        no_recompute_reason="the fused torch kernels manage their own backward memory.",
        summary="torch's fused kernels (cuDNN, oneDNN) on the pieces between restarts, "
        "padded into one call",
    )
)  # fmt: skip
register_recurrent_backend(
    RecurrentBackend(
        "scan", _scan, lambda kind, python_based: None,
        summary="a loop over time of the cell's step, the stored state selected at restarts",
    )
)  # fmt: skip
register_recurrent_backend(
    RecurrentBackend(
        "triton", _triton, _triton_refuses, check=_triton_check,
        summary="recurrl's fused CUDA kernel (the whole sequence, restarts inside)",
    )
)  # fmt: skip
register_recurrent_backend(
    RecurrentBackend(
        "assoc", _assoc, assoc_refuses,
        summary="a parallel (associative) scan over time, for linear-recurrent cells",
    )
)  # fmt: skip
register_recurrent_backend(
    RecurrentBackend(
        "cpp", _cpp, cpp_refuses, check=cpp_check,
        summary="recurrl's fused C++ loop over time on CPU (compiled on first use)",
    )
)  # fmt: skip
_DEFAULT_OPTIONS = RecurrentOptions()
