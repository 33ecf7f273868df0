"""Deployment: a policy's acting step exported with explicit state, to ONNX or ``torch.export``.

The exported graph is the acting step as a pure function (built by
:func:`~recurrl.trainers._export_graph.build_acting_step`)::

    (observation, is_init, *states[, action_noise]) -> (action[, extra outputs], *next_states)

with everything the policy applies at acting time inside it: the env's observation
transforms (masking, one-hot encoding), observation scaling / normalization, the image
encoder, the reset of the state at ``is_init``, the recurrent cells (plain torch, not the
C++ acting step), the heads and the action (the distribution's mode, or a sample from a noise
input), rescaled to the action bounds. Inputs and outputs are named after their TensorDict
keys (parts joined with ``"_"``: ``actor_h``, ``next_actor_h``); their names, shapes, dtypes
and roles are written into the file (ONNX metadata ``"recurrl.export"``, a pt2 extra file
``recurrl.json``) and into a JSON beside it (``<file>.json``), which :func:`read_metadata`
reads.

Two entry points: :func:`export_policy` for a policy built in code, :func:`export_run` (the
``recurrl export RUN_DIR`` command) for a trained run directory. ONNX needs the ``export``
extra (``pip install "recurrl[export]"``: onnx, onnxruntime and onnxscript, torch's ONNX
exporter); ``pt2`` needs torch only. ``examples/deploy/run_onnx.py`` runs an exported policy
in a gymnasium env with numpy and onnxruntime only.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictSequential as Seq
from tensordict.utils import NestedKey
from torch import Tensor, nn

import recurrl
from recurrl.envs import specs
from recurrl.envs.transforms.observation import ObservationTransform
from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers._export_graph import (
    IS_INIT,
    ActingStep,
    ExportError,
    Key,
    build_acting_step,
    key_name,
    register_export_cell,
)
from recurrl.trainers.encoders import observation_inputs
from recurrl.trainers.errors import UsageError
from recurrl.trainers.evaluate import load_config, require_checkpoint
from recurrl.trainers.models import QNetwork, actor_critic, make_env

__all__ = [
    "FORMATS",
    "ExportError",
    "add_export_parser",
    "export_policy",
    "export_run",
    "read_metadata",
    "register_export_cell",
    "run_export",
]

#: the file formats: ONNX (onnxruntime, no torch) and torch.export's ``.pt2``
FORMATS = ("onnx", "pt2")
#: the ONNX opset written
OPSET = 18
#: the metadata entry of the ONNX file (and the extra file of a pt2 archive: ``recurrl.json``)
META_KEY = "recurrl.export"
PT2_META = "recurrl.json"
#: exported outputs agree with the eager acting step within this (float32), checked at export
TOLERANCE = 1e-5


# ---------------------------------------------------------------------------- library API
def export_policy(
    policy: nn.Module,
    example: TensorDictBase | Mapping[NestedKey, Tensor],
    path: str | Path,
    *,
    format: str = "onnx",
    sample: bool = False,
    batch: int | str = 1,
    outputs: Sequence[NestedKey] = ("action",),
    transforms: Sequence[ObservationTransform] = (),
    metadata: Mapping[str, Any] | None = None,
    verify: bool = True,
) -> dict[str, Any]:
    """Export the acting step of ``policy`` to ``path``; returns the metadata written.

    The graph's inputs are what the policy reads (``"observation"``, ``"is_init"`` ``[B, 1]``
    bool, every recurrent state ``[B, L, S]``; with ``sample`` a noise input), its outputs
    ``outputs`` then every next state (``next_<state>``). The run is checked before the
    file is kept: two chained steps of the exported graph (torch.export's program, or
    onnxruntime on the ONNX file when it is installed) must match the eager acting step
    within ``1e-5``.

    Args:
        policy: the acting module (a ``TensorDictSequential`` of ``TensorDictModule`` s,
            recurrent modules, recurrl's samplers, ``QValueModule``...).
        example: one step of inputs, batch ``[B]`` (row 0 is used): what the policy reads
            (``"observation"`` ``[B, F]``...; ``transforms`` given: what the first one reads).
            Missing states are zeros, a missing ``"is_init"`` is True.
        path: the file to write; the metadata goes beside it as ``<path>.json``.
        format: ``"onnx"`` or ``"pt2"``.
        sample: the action is a sample driven by the noise input ``action_noise`` (uniform
            in ``(0, 1)`` ``[B, A]`` for a categorical: Gumbel-max; standard normal ``[B, A]``
            for a squashed Gaussian; uniform ``[B, 2]`` for epsilon-greedy), so the graph stays
            a pure function; default: the distribution's mode (greedy).
        batch: the batch size ``B`` of the graph, or ``"dynamic"`` (any ``B >= 1``).
        outputs: the keys returned before the next states (e.g. ``("action", "logits")``).
        transforms: env-side observation transforms (``MaskObservation``,
            ``OneHotObservation``...) to apply inside the graph first, so the graph reads
            the env's raw observation.
        metadata: extra entries for the metadata (e.g. the env the policy acts in).
        verify: run the written file and compare it with the eager step.

    Raises:
        ExportError: a module of the policy cannot be exported (named, with a fix), or the
            export would not match the eager step.

    Examples:
        >>> import tempfile
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule as Mod
        >>> from recurrl.modules import LSTMModule
        >>> from recurrl.trainers.models import CategoricalSampler
        >>> policy = Seq(LSTMModule(3, 8, in_key="observation", out_key="features"),
        ...              Mod(nn.Linear(8, 2), ["features"], ["logits"]),
        ...              Mod(CategoricalSampler(), ["logits"], ["action", "log_prob"]))
        >>> example = TensorDict(observation=torch.randn(1, 3), batch_size=[1])
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     meta = export_policy(policy, example, f"{tmp}/policy.pt2", format="pt2")
        >>> [(x["name"], x["shape"]) for x in meta["inputs"]]  # doctest: +NORMALIZE_WHITESPACE
        [('observation', [1, 3]), ('is_init', [1, 1]), ('recurrent_state_h', [1, 1, 8]),
         ('recurrent_state_c', [1, 1, 8])]
        >>> [x["name"] for x in meta["outputs"]]
        ['action', 'next_recurrent_state_h', 'next_recurrent_state_c']
    """
    if format not in FORMATS:
        raise UsageError(f"export: format must be one of {FORMATS}, received {format!r}.")
    dynamic = batch == "dynamic"
    if not dynamic and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise UsageError(
            f"export: batch must be a positive int or 'dynamic', received {batch!r}. Fix: "
            f"batch=1 (one env), or batch='dynamic'."
        )
    path = Path(path)
    act = build_acting_step(policy, sample=sample, transforms=transforms, outputs=outputs)
    with _eval_mode(act):
        inputs = _example_inputs(act, example, 2 if dynamic else int(batch))
        values = act.probe(inputs)
        # the noise the probe drew (the other values may be overwritten: the mask's)
        inputs = [values[k] if x is None else x for k, x in zip(act.input_keys, inputs)]
        program = _trace(act, inputs, values, dynamic)
        meta = _metadata(act, inputs, values, format, sample, batch, metadata)
        if format == "onnx":
            _refuse_complex(act, program)
            _write_onnx(program, act, path, meta)
        else:
            torch.export.save(program, path, extra_files={PT2_META: json.dumps(meta)})
        if verify:
            meta["verified"] = _verify(act, path, format, inputs)
    Path(f"{path}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of an exported file: ``<path>.json`` beside it, else the copy inside
    the file (ONNX: needs onnxruntime).

    Examples:
        >>> read_metadata("missing.onnx")
        Traceback (most recent call last):
        ...
        recurrl.trainers.errors.UsageError: export: no metadata for missing.onnx: neither ...
    """
    path = Path(path)
    beside = Path(f"{path}.json")
    if beside.is_file():
        return json.loads(beside.read_text())
    if not path.is_file():
        raise UsageError(
            f"export: no metadata for {path}: neither {beside} nor the file exists. Fix: pass "
            f"the file `recurrl export` wrote."
        )
    if path.suffix == ".pt2":
        extra = {PT2_META: ""}
        torch.export.load(path, extra_files=extra)
        return json.loads(extra[PT2_META])
    ort = _require("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return json.loads(session.get_modelmeta().custom_metadata_map[META_KEY])


# ---------------------------------------------------------------------------- run directories
def export_run(
    run_dir: str | Path,
    path: str | Path | None = None,
    *,
    format: str = "onnx",
    sample: bool = False,
    batch: int | str = 1,
    logits: bool = False,
    value: bool = False,
) -> Path:
    """Export the checkpointed policy of a run directory (what ``recurrl export`` runs).

    The graph reads the env's raw observation (gymnasium's, before recurrl's masking and
    one-hot encoding, which are inside). Returns the path written.

    Args:
        run_dir: a directory of ``recurrl train`` (``config.json``, ``checkpoint.pt``).
        path: the file; default ``run_dir/policy.<format>``.
        format: ``"onnx"`` or ``"pt2"``.
        sample: sample the action from a noise input (default: greedy).
        batch: the graph's batch size, or ``"dynamic"``.
        logits: also output the distribution's parameters (``logits``, or ``loc`` and
            ``scale``; DQN: ``action_value``).
        value: also output the critic's ``state_value`` (PPO).
    """
    cfg = load_config(run_dir)
    if cfg.env.is_multiagent():
        raise ExportError(
            f"recurrl export: {run_dir} trained the agents of the multi-agent task "
            f"{cfg.env.env!r}; exporting a policy over an agent group (one state per agent) is "
            f"not supported. Fix: run it in Python with `recurrl eval` / the checkpoint, or "
            f"export a one-agent run."
        )
    require_checkpoint(run_dir)
    state = ckpt.load(run_dir)
    env = make_env(cfg.env, num_envs=1, seed=cfg.run.seed)
    try:
        transforms = [t for t in env.transform if isinstance(t, ObservationTransform)]
        example = env.base_env.reset()
        action = _action_info(env.action_spec)
        if cfg.algo == "dqn":
            model = QNetwork(cfg.model, observation_inputs(env), env.action_spec.n,
                             obs_scale=cfg.dqn.obs_scale)  # fmt: skip
        else:
            model = actor_critic(cfg, env)
    finally:
        env.close()
    model.load_state_dict(state["model"])
    policy, outputs = _run_policy(cfg.algo, model, cfg, logits=logits, value=value)
    path = Path(run_dir) / f"policy.{format}" if path is None else Path(path)
    env_info = {
        "name": cfg.env.env, "gym_id": cfg.env.gym_id(), "engine": cfg.env.resolved_engine(),
        "max_episode_steps": cfg.env.max_episode_steps,
    }  # fmt: skip
    source = {"run_dir": str(run_dir), "algo": cfg.algo, "memory": cfg.model.memory}
    export_policy(
        policy, example, path, format=format, sample=sample, batch=batch, outputs=outputs,
        transforms=transforms, metadata={"source": source, "env": env_info, "action": action},
    )  # fmt: skip
    return path


def _run_policy(
    algo: str, model: nn.Module, cfg: Any, *, logits: bool, value: bool
) -> tuple[nn.Module, list[str]]:
    """The acting module of a run's model and the outputs to export."""
    if algo == "dqn":
        if value:
            raise UsageError(
                "recurrl export: a DQN run has no state value (--value). Fix: --logits exports "
                "its action values."
            )
        policy = model.policy(epsilon=cfg.dqn.eps_end)
        return policy, ["action", *(["action_value"] if logits else [])]
    sampler = model.policy(True).module[-1]  # the actor's sampler (its mode when greedy)
    policy = Seq(model.actor, *([model.critic] if value else []), sampler)
    params = ["loc", "scale"] if model.continuous else ["logits"]
    return policy, ["action", *(params if logits else []), *(["state_value"] if value else [])]


def _action_info(spec: Any) -> dict[str, Any]:
    """The action space, for the runner: discrete ``n``, ``multi_discrete`` ``nvec`` or
    ``box`` ``low``/``high``."""
    if isinstance(spec, specs.MultiCategorical):
        return {"space": "multi_discrete", "nvec": spec.nvec.reshape(-1).tolist()}
    if isinstance(spec, specs.Categorical):
        return {"space": "discrete", "n": int(spec.n)}
    low, high = spec.low.reshape(-1, spec.shape[-1])[0], spec.high.reshape(-1, spec.shape[-1])[0]
    return {"space": "box", "low": low.tolist(), "high": high.tolist()}


# ---------------------------------------------------------------------------- command line
def add_export_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``export`` subcommand to the ``recurrl`` subparsers ``sub``."""
    ex = sub.add_parser(
        "export",
        help="export a trained policy's acting step (explicit state) to ONNX or torch.export",
        description="Export the acting step of a run's checkpointed policy as a pure function "
        "(observation, is_init, states[, action_noise]) -> (action, next states), with the "
        "observation masking, scaling, encoders, the reset at is_init and the action "
        "rescaling inside. Writes FILE and FILE.json (input/output names, shapes, roles); "
        "the last line printed is FILE. ONNX needs the export extra (pip install "
        "'recurrl[export]'); run it without torch with examples/deploy/run_onnx.py.",
    )
    ex.add_argument("run_dir", metavar="RUN_DIR", help="directory printed by `recurrl train`")
    ex.add_argument("--format", choices=FORMATS, default="onnx", help="file format (default: onnx)")
    ex.add_argument("-o", "--output", default=None, metavar="FILE",
                    help="file to write (default: RUN_DIR/policy.<format>)")  # fmt: skip
    mode = ex.add_mutually_exclusive_group()
    mode.add_argument("--greedy", dest="sample", action="store_false",
                      help="the most likely action (default)")  # fmt: skip
    mode.add_argument(
        "--sample", dest="sample", action="store_true",
        help="a sample, driven by an input action_noise (uniform in (0, 1) for a categorical, "
        "standard normal for a Box action) so the graph stays a pure function",
    )  # fmt: skip
    ex.set_defaults(sample=False)
    ex.add_argument("--batch", type=_batch_arg, default=1, metavar="N|dynamic",
                    help="batch size of the graph, or dynamic (default: 1)")  # fmt: skip
    ex.add_argument(
        "--logits", action="store_true",
        help="also output the distribution's parameters (logits / loc, scale)",
    )  # fmt: skip
    ex.add_argument("--value", action="store_true", help="also output the critic's state_value")
    return ex


def _batch_arg(text: str) -> int | str:
    if text == "dynamic":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int or 'dynamic', got {text!r}")
    return value


def run_export(args: argparse.Namespace) -> int:
    """Run ``recurrl export`` from parsed arguments; prints the file written last."""
    path = export_run(
        args.run_dir, args.output, format=args.format, sample=args.sample, batch=args.batch,
        logits=args.logits, value=args.value,
    )  # fmt: skip
    print(f"metadata: {path}.json")
    print(path)
    return 0


# ---------------------------------------------------------------------------- internals
@contextlib.contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` and its submodules in eval mode (no dropout), their modes restored after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _rows(value: Tensor, rows: int) -> Tensor:
    return value[:1].expand(rows, *value.shape[1:]).contiguous()


def _example_inputs(act: ActingStep, example: Any, rows: int) -> list[Tensor | None]:
    """The graph's inputs for ``rows`` rows, from row 0 of ``example`` (noise: ``None``,
    drawn by the probe)."""
    if isinstance(example, TensorDictBase):
        if example.batch_dims == 0:
            example = example.unsqueeze(0)
        elif example.batch_dims > 1:
            example = example.reshape(-1)

        def get(key: Key) -> Tensor | None:
            return example.get(key, None)
    elif isinstance(example, Mapping):
        given = {(k,) if isinstance(k, str) else tuple(k): v for k, v in example.items()}

        def get(key: Key) -> Tensor | None:
            return given.get(key)
    else:
        raise UsageError(
            f"export: example must be a TensorDict (or a dict of tensors) of one step, "
            f"received {type(example).__name__}."
        )
    inputs: list[Tensor | None] = []
    for key in act.input_keys:
        value = get(key)
        if key in act.noise_keys:
            inputs.append(None)
        elif value is not None:
            value = torch.as_tensor(value)
            if key == IS_INIT:  # 0/1 integers as eager accepts them; the graph reads bool
                value = value.to(torch.bool).reshape(-1, 1)
            elif key in act.state_specs:
                value = value.to(act.state_specs[key][1])
            inputs.append(_rows(value, rows))
        elif key == IS_INIT:
            inputs.append(torch.ones(rows, 1, dtype=torch.bool))
        elif key in act.state_specs:
            shape, dtype = act.state_specs[key]
            inputs.append(torch.zeros(rows, *shape, dtype=dtype))
        else:
            raise ExportError(
                f"export: the policy reads {key_name(key)!r}, which the example lacks (it "
                f"holds {_example_keys(example)}). Fix: an example step with every input "
                f"the policy reads (e.g. env.reset())."
            )
    return inputs


def _example_keys(example: Any) -> list[str]:
    keys = example.keys(True, True) if isinstance(example, TensorDictBase) else example.keys()
    return sorted(key_name(k) for k in keys)


def _trace(act: ActingStep, inputs: list[Tensor], values: dict, dynamic: bool) -> Any:
    """``torch.export`` of the acting step; a failure is blamed on the first step that
    cannot be traced on its own."""
    shapes = None
    if dynamic:
        batch = torch.export.Dim("batch", min=1)
        shapes = [tuple({0: batch} for _ in inputs)]
    try:
        return torch.export.export(act, tuple(inputs), dynamic_shapes=shapes, strict=False)
    except Exception as err:
        for step in act.steps:
            args = tuple(values[k] for k in step.in_keys)
            try:
                torch.export.export(_Single(step.fn), args, strict=False)
            except Exception as step_err:
                first = str(step_err).strip().splitlines()[0] if str(step_err).strip() else ""
                raise ExportError(
                    f"export: {step.owner} cannot be exported: torch.export cannot trace it "
                    f"({type(step_err).__name__}: {first}). Fix: write it with torch "
                    f"operations on tensors only (no .item(), .tolist(), numpy or Python "
                    f"branches on a tensor's value), as an nn.Module in a TensorDictModule."
                ) from step_err
        raise ExportError(f"export: torch.export failed on the acting step: {err}") from err


class _Single(nn.Module):
    """One step alone (to find the step that blocks a trace)."""

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: Tensor) -> Any:
        return self.fn(*xs)


def _dtype(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _shape(t: Tensor, dynamic: bool) -> list[int | str]:
    return ["batch" if dynamic and i == 0 else int(s) for i, s in enumerate(t.shape)]


def _metadata(
    act: ActingStep, inputs: list[Tensor], values: dict, fmt: str, sample: bool,
    batch: int | str, extra: Mapping[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    dynamic = batch == "dynamic"

    def role(key: Key) -> str:
        if key == IS_INIT:
            return "is_init"
        if key in act.state_keys:
            return "state"
        return "noise" if key in act.noise_keys else "observation"

    # the inputs as given (a transform may overwrite its input key, e.g. the mask)
    inputs = [
        {"name": key_name(k), "key": list(k), "shape": _shape(x, dynamic), "dtype": _dtype(x),
         "role": role(k)}
        for k, x in zip(act.input_keys, inputs, strict=True)
    ]  # fmt: skip
    next_of = dict(zip(act.next_state_keys, act.state_keys, strict=True))
    outputs = []
    for k in act.output_keys:
        entry = {"name": key_name(k), "key": list(k), "shape": _shape(values[k], dynamic),
                 "dtype": _dtype(values[k])}  # fmt: skip
        if k in next_of:
            entry.update(role="next_state", state_input=key_name(next_of[k]))
        else:
            entry["role"] = "action" if k == act.output_keys[0] else "output"
        outputs.append(entry)
    noise = [{"input": key_name(k), "distribution": d} for k, d in act.noise_keys.items()]
    meta = {
        "recurrl_export": 1, "format": fmt, "recurrl_version": recurrl.__version__,
        "torch_version": torch.__version__, "mode": "sample" if sample else "greedy",
        "batch": batch, "inputs": inputs, "outputs": outputs, "noise": noise,
    }  # fmt: skip
    if fmt == "onnx":
        meta["opset"] = OPSET
    meta.update(extra or {})
    return meta


def _refuse_complex(act: ActingStep, program: Any) -> None:
    """ONNX has no complex tensors: name the module whose step computes in them."""
    for node in program.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, Tensor) and val.is_complex():
            stack = node.meta.get("nn_module_stack") or {}
            where = [path for path, _ in stack.values()][-1:] or ["the acting step"]
            raise ExportError(
                f"export: {where[0]} computes in complex numbers ({node.target}), which ONNX "
                f"cannot hold. Fix: register a real-arithmetic step for its cell kind with "
                f"recurrl.trainers.export.register_export_cell(kind, builder) (the LRU's is "
                f"the model), or export with format='pt2'."
            )


@contextlib.contextmanager
def _quiet_onnx() -> Iterator[None]:
    """torch's ONNX exporter without its warnings about operators of packages not
    installed (torchvision) and deprecation notices: they say nothing about this graph."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _require(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError as err:
        raise UsageError(
            f"export: ONNX needs {name}, which is not installed. Fix: pip install "
            f"'recurrl[export]' (onnx, onnxruntime, onnxscript), or --format pt2."
        ) from err


def _write_onnx(program: Any, act: ActingStep, path: Path, meta: dict[str, Any]) -> None:
    for name in ("onnx", "onnxscript"):
        _require(name)
    if "dynamo" not in inspect.signature(torch.onnx.export).parameters:
        raise UsageError(
            f"export: ONNX export goes through torch's torch.export-based exporter "
            f"(torch.onnx.export(..., dynamo=True)), which torch {torch.__version__} lacks. "
            f"Fix: upgrade torch (tested with 2.13), or --format pt2."
        )
    names_in = [key_name(k) for k in act.input_keys]
    names_out = [key_name(k) for k in act.output_keys]
    with _quiet_onnx():
        onnx_program = torch.onnx.export(
            program, (), None, dynamo=True, input_names=names_in, output_names=names_out,
            opset_version=OPSET, external_data=False, verbose=False,
        )  # fmt: skip
    model = onnx_program.model
    if meta["batch"] == "dynamic":  # name the batch dim "batch" (the exporter's is "s<n>")
        import onnx_ir

        for value in [*model.graph.inputs, *model.graph.outputs]:
            if value.shape is not None and not isinstance(value.shape[0], int):
                value.shape = onnx_ir.Shape(["batch", *value.shape[1:]])
    model.metadata_props[META_KEY] = json.dumps(meta)
    onnx_program.save(path, external_data=False)


def _verify(act: ActingStep, path: Path, fmt: str, inputs: list[Tensor]) -> bool:
    """Two chained steps of the written file against the eager acting step (the second
    from the first's next states, ``is_init`` False); ``False`` when onnxruntime is not
    installed (not checked)."""
    if fmt == "onnx":
        try:
            import onnxruntime as ort
        except ImportError:
            return False
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [key_name(k) for k in act.input_keys]

        def run(xs: list[Tensor]) -> list[Tensor]:
            feed = {n: x.numpy() for n, x in zip(names, xs, strict=True)}
            return [torch.from_numpy(o) for o in session.run(None, feed)]
    else:
        module = torch.export.load(path).module()

        def run(xs: list[Tensor]) -> list[Tensor]:
            with torch.no_grad():
                return list(module(*xs))

    position = {k: i for i, k in enumerate(act.output_keys)}
    for step in range(2):
        with torch.no_grad():
            expected = act(*inputs)
        got = run(inputs)
        for key, e, g in zip(act.output_keys, expected, got, strict=True):
            same = torch.equal(e, g) if not e.is_floating_point() else torch.allclose(
                e, g, atol=TOLERANCE, rtol=TOLERANCE)  # fmt: skip
            if not same:
                raise ExportError(
                    f"export: the exported {fmt} graph disagrees with the eager acting step on "
                    f"{key_name(key)!r} at step {step} of the check (max difference "
                    f"{(e.double() - g.double()).abs().max().item():.3g}). This is a bug: "
                    f"please report it with the policy."
                )
        inputs = list(inputs)  # the next step: states carried, no reset
        for i, key in enumerate(act.input_keys):
            if key == IS_INIT:
                inputs[i] = torch.zeros_like(inputs[i])
            elif key in act.state_keys:
                inputs[i] = expected[position[("next", *key)]]
    return True
