"""Export of the acting step (ONNX, torch.export): exact against eager recurrl on recorded
episodes for every memory kind, the samplers, the refusals, the metadata and the CLI."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictModuleBase
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.modules import EGreedyModule, GRUModule, LRUModule
from recurrl.trainers import _export_graph
from recurrl.trainers import checkpoint as ckpt
from recurrl.trainers.cli import main
from recurrl.trainers.config import EnvConfig, ModelConfig
from recurrl.trainers.evaluate import evaluate
from recurrl.trainers.export import ExportError, export_policy, read_metadata
from recurrl.trainers.models import ActorCritic, CategoricalSampler, actor_critic, make_env

from ._helpers import parse_train

ONNX_REASON = "ONNX export needs the export extra: pip install 'recurrl[export]'"
ROOT = Path(__file__).resolve().parents[2]
STEPS = 40  # per env: CartPole-masked episodes of a random policy end inside (resets)


def _need(fmt: str) -> None:
    if fmt == "onnx":
        pytest.importorskip("onnxruntime", reason=ONNX_REASON)
        pytest.importorskip("onnxscript", reason=ONNX_REASON)


def _runner(path: Path, fmt: str):
    """``run(inputs: list[Tensor]) -> list[Tensor]`` of an exported file."""
    if fmt == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda xs: [torch.from_numpy(o) for o in session.run(
            None, {n: x.numpy() for n, x in zip(names, xs, strict=True)})]  # fmt: skip
    module = torch.export.load(path).module()
    return lambda xs: list(module(*xs))


def _record(model: ActorCritic, n_envs: int = 3):
    """A greedy rollout ``[n_envs, STEPS]`` of the model on CartPole-masked (recurrl's eager
    acting step, resets inside)."""
    env = make_env(EnvConfig(), num_envs=n_envs, seed=0)
    collector = Collector(env, model.policy(True), frames_per_batch=n_envs * STEPS)
    try:
        batch = collector.rollout()
    finally:
        collector.shutdown()
    assert batch["is_init"][:, 1:].any()  # episodes restart inside the record
    return batch


MEMORIES = [("lstm", 1), ("gru", 1), ("mingru", 1), ("lru", 1), ("lstm", 2), ("lru", 2),
            ("transformer", 1), ("transformer", 2), ("none", 1)]  # fmt: skip


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
@pytest.mark.parametrize(("memory", "layers"), MEMORIES)
def test_exported_step_replays_recorded_episodes(tmp_path, fmt, memory, layers):
    """Every memory kind: the exported graph, fed the recorded observations and is_init and
    its own carried state, gives the recorded greedy actions, logits and next states."""
    _need(fmt)
    torch.manual_seed(0)
    model = ActorCritic(ModelConfig(memory=memory, hidden_size=8, num_layers=layers), 2, 2)
    batch = _record(model)
    policy = model.policy(True)
    path = tmp_path / f"policy.{fmt}"
    meta = export_policy(policy, batch[:, 0], path, format=fmt, batch="dynamic",
                         outputs=("action", "logits"))  # fmt: skip
    assert meta["verified"] is True
    run = _runner(path, fmt)
    names = [e["name"] for e in meta["inputs"]]
    states = [e for e in meta["inputs"] if e["role"] == "state"]
    n_states = {"lstm": 2, "gru": 1, "mingru": 1, "lru": 2, "transformer": 2, "none": 0}
    assert len(states) == n_states[memory]
    carried = [torch.zeros(3, *e["shape"][1:]) for e in states]
    for t in range(STEPS):
        step = batch[:, t]
        feed = {"observation": step["observation"], "is_init": step["is_init"],
                **{e["name"]: c for e, c in zip(states, carried, strict=True)}}  # fmt: skip
        out = run([feed[n] for n in names])  # a feed-forward graph reads no is_init
        assert torch.equal(out[0], step["action"]), t
        torch.testing.assert_close(out[1], step["logits"], atol=1e-5, rtol=1e-5)
        for i, e in enumerate(states):
            torch.testing.assert_close(out[2 + i], step["next", e["name"]], atol=1e-5, rtol=1e-5)
        carried = out[2:]


def test_complex_state_of_the_lru_is_exported_as_real_pairs(tmp_path):
    """The LRU's complex state is stored as [Re h | Im h]; the ONNX graph holds no complex
    tensor, and without its real-arithmetic step the export is refused by name."""
    _need("onnx")
    import onnx

    torch.manual_seed(0)
    model = ActorCritic(ModelConfig(memory="lru", hidden_size=4), 2, 2)
    example = _record(model, n_envs=1)[:, 0]
    meta = export_policy(model.policy(True), example, tmp_path / "p.onnx")
    assert [e["shape"] for e in meta["inputs"] if e["role"] == "state"] == [[1, 1, 4], [1, 1, 8]]
    complex_types = {onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128}
    graph = onnx.load(str(tmp_path / "p.onnx")).graph
    assert all(v.type.tensor_type.elem_type not in complex_types
               for v in [*graph.input, *graph.output, *graph.value_info])  # fmt: skip
    cells = dict(_export_graph._EXPORT_CELLS)
    try:
        del _export_graph._EXPORT_CELLS["lru"]  # the generic step: complex ops
        with pytest.raises(ExportError, match=r"complex numbers.*register_export_cell"):
            export_policy(model.policy(True), example, tmp_path / "q.onnx")
        export_policy(model.policy(True), example, tmp_path / "q.pt2", format="pt2")
    finally:
        _export_graph._EXPORT_CELLS.clear()
        _export_graph._EXPORT_CELLS.update(cells)


def test_sample_mode_reads_a_noise_input(tmp_path):
    """Categorical: Gumbel-max on uniform noise (the exact sample of softmax(logits));
    squashed Gaussian: mid + half * tanh(loc + scale * noise)."""
    torch.manual_seed(0)
    model = ActorCritic(ModelConfig(memory="gru", hidden_size=8), 2, 3)
    logits = torch.tensor([[0.5, -1.0, 1.2]]).expand(4000, 3)
    policy = Seq(Mod(nn.Identity(), ["observation"], ["logits"]),
                 Mod(CategoricalSampler(), ["logits"], ["action", "lp"]))  # fmt: skip
    meta = export_policy(policy, {"observation": logits}, tmp_path / "c.pt2", format="pt2",
                         sample=True, batch="dynamic")  # fmt: skip
    assert meta["noise"] == [{"input": "action_noise", "distribution": "uniform(0,1)"}]
    run = _runner(tmp_path / "c.pt2", "pt2")
    noise = torch.rand(4000, 3, generator=torch.Generator().manual_seed(1))
    (action,) = run([logits, noise])
    assert torch.equal(action, (logits - torch.log(-torch.log(noise))).argmax(-1))
    freq = torch.bincount(action, minlength=3).float() / 4000
    assert (freq - logits[0].softmax(-1)).abs().max() < 0.03

    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])
    model = ActorCritic(ModelConfig(memory="gru", hidden_size=8), 3, 2, action_bounds=(low, high))
    obs = torch.randn(1, 3)
    td = model.actor(_step(obs, model))
    export_policy(model.policy(True), _step(obs, model), tmp_path / "g.pt2", format="pt2",
                  sample=True)  # fmt: skip
    gauss = torch.randn(1, 2)
    action, _ = _runner(tmp_path / "g.pt2", "pt2")([obs, td["is_init"], torch.zeros(1, 1, 8),
                                                    gauss])  # fmt: skip
    expected = (low + high) / 2 + (high - low) / 2 * torch.tanh(td["loc"] + td["scale"] * gauss)
    torch.testing.assert_close(action, expected)
    export_policy(model.policy(True), _step(obs, model), tmp_path / "m.pt2", format="pt2")
    greedy, _ = _runner(tmp_path / "m.pt2", "pt2")([obs, td["is_init"], torch.zeros(1, 1, 8)])
    torch.testing.assert_close(greedy, model.policy(True)(_step(obs, model))["action"])


def _step(obs, model):
    from tensordict import TensorDict

    return TensorDict(observation=obs, is_init=torch.ones(len(obs), 1, dtype=torch.bool),
                      batch_size=[len(obs)])  # fmt: skip


class _TensorDictHead(TensorDictModuleBase):
    in_keys, out_keys = ["features"], ["action"]

    def forward(self, td):
        td["action"] = td["features"].argmax(-1)
        return td


class _BranchingHead(nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x  # a Python branch on a tensor's value


def test_unexportable_modules_are_refused_by_name(tmp_path):
    gru = GRUModule(3, 4, in_key="observation", out_key="features")
    example = {"observation": torch.randn(1, 3)}
    listy = Mod(lambda f: torch.tensor([max(range(4), key=r.__getitem__) for r in f.tolist()]),
                ["features"], ["action"])  # fmt: skip
    cases = [
        (Seq(gru, _TensorDictHead()), r"policy\[1\] \(_TensorDictHead\).*TensorDictModule"),
        (Seq(gru, listy), r"policy\[1\] \(TensorDictModule\) cannot be exported.*tolist"),
        (Seq(gru, Mod(_BranchingHead(), ["features"], ["action"])),
         r"policy\[1\] \(TensorDictModule\) cannot be exported"),
    ]  # fmt: skip
    for policy, match in cases:
        with pytest.raises(ExportError, match=match):
            export_policy(policy, example, tmp_path / "p.pt2", format="pt2")
    assert not (tmp_path / "p.pt2").exists()
    from recurrl.envs import Categorical

    egreedy = Seq(gru, Mod(nn.Linear(4, 2), ["features"], ["action"]),
                  EGreedyModule(Categorical(2)))  # fmt: skip
    with pytest.raises(ExportError, match=r"EGreedyModule.*--greedy"):
        export_policy(egreedy, example, tmp_path / "p.pt2", format="pt2", sample=True)
    export_policy(egreedy, example, tmp_path / "p.pt2", format="pt2")  # greedy: identity
    with pytest.raises(ExportError, match=r"writes no \['logits'\].*'features'"):
        export_policy(egreedy, example, tmp_path / "p.pt2", format="pt2", outputs=["logits"])
    with pytest.raises(ExportError, match="example lacks"):
        export_policy(egreedy, {"obs": torch.randn(1, 3)}, tmp_path / "p.pt2", format="pt2")
    with pytest.raises(ValueError, match="format must be one of"):
        export_policy(egreedy, example, tmp_path / "p.tfl", format="tflite")
    with pytest.raises(ValueError, match="batch must be a positive int"):
        export_policy(egreedy, example, tmp_path / "p.pt2", format="pt2", batch=0)


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_metadata_in_the_file_and_beside_it(tmp_path, fmt):
    _need(fmt)
    lru = LRUModule(3, 4, num_layers=2, in_key="observation", out_key="features")
    policy = Seq(lru, Mod(nn.Linear(4, 2), ["features"], ["logits"]),
                 Mod(CategoricalSampler(), ["logits"], ["action", "lp"]))  # fmt: skip
    path = tmp_path / f"p.{fmt}"
    meta = export_policy(policy, {"observation": torch.randn(5, 3)}, path, format=fmt,
                         batch="dynamic", metadata={"env": {"gym_id": "X-v0"}})  # fmt: skip
    beside = json.loads(Path(f"{path}.json").read_text())
    assert beside == meta and read_metadata(path) == meta
    Path(f"{path}.json").unlink()
    inside = read_metadata(path)  # the copy in the file
    assert {k: v for k, v in inside.items() if k != "verified"} == {
        k: v for k, v in meta.items() if k != "verified"}  # fmt: skip
    assert meta["mode"] == "greedy" and meta["batch"] == "dynamic" and meta["env"]["gym_id"]
    assert [(e["name"], e["shape"], e["dtype"], e["role"]) for e in meta["inputs"]] == [
        ("observation", ["batch", 3], "float32", "observation"),
        ("is_init", ["batch", 1], "bool", "is_init"),
        ("recurrent_state_y", ["batch", 2, 4], "float32", "state"),
        ("recurrent_state_h", ["batch", 2, 8], "float32", "state"),
    ]
    assert [(e["name"], e.get("state_input")) for e in meta["outputs"]] == [
        ("action", None), ("next_recurrent_state_y", "recurrent_state_y"),
        ("next_recurrent_state_h", "recurrent_state_h"),
    ]  # fmt: skip
    if fmt == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [(i.name, i.shape) for i in session.get_inputs()] == [
            (e["name"], e["shape"]) for e in meta["inputs"]]  # fmt: skip
        assert [o.name for o in session.get_outputs()] == [e["name"] for e in meta["outputs"]]


def _fixed_run(tmp_path: Path, *argv: str) -> Path:
    """A run directory holding a fixed (untrained, seeded) policy: config.json and
    checkpoint.pt, as ``recurrl train`` writes them."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = parse_train("--hidden-size", "8", "--engine", "gymnasium", *argv)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    env = make_env(cfg.env, num_envs=1)
    torch.manual_seed(3)
    model = actor_critic(cfg, env)
    env.close()
    with torch.no_grad():  # a steeper head: actions that follow the observation
        model.actor[-1].module[-1].weight.mul_(20.0)
    ckpt.write_file(run_dir / ckpt.CHECKPOINT, {"model": model.state_dict()})
    return run_dir


def _load_runner():
    spec = importlib.util.spec_from_file_location(
        "run_onnx", ROOT / "examples" / "deploy" / "run_onnx.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_export_and_the_torch_free_runner_match_recurrl_eval(tmp_path, capsys):
    """`recurrl export RUN_DIR` then examples/deploy/run_onnx.py on CartPole-masked: the
    greedy returns equal `recurrl eval`'s on the same seeds, episode by episode (the
    masking is inside the graph: the runner feeds gymnasium's raw observation)."""
    _need("onnx")
    run_dir = _fixed_run(tmp_path)
    assert main(["export", str(run_dir), "--format", "onnx"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    path = Path(lines[-1])
    assert path == run_dir / "policy.onnx" and path.is_file()
    meta = read_metadata(path)
    assert meta["inputs"][0]["shape"] == [1, 4]  # the raw CartPole observation
    assert meta["env"] == {"name": "CartPole-masked", "gym_id": "CartPole-v1",
                           "engine": "gymnasium", "max_episode_steps": None}  # fmt: skip
    runner = _load_runner()
    returns = runner.run_episodes(path, episodes=6, seed=11)
    assert returns == evaluate(run_dir, episodes=6, seed=11)
    assert len(set(returns)) > 1  # episodes that differ: a comparison that can fail
    sampled = tmp_path / "sampled.onnx"
    assert main(["export", str(run_dir), "-o", str(sampled), "--sample"]) == 0
    assert all(math.isfinite(r) for r in runner.run_episodes(sampled, episodes=2, seed=0))


def test_a_run_on_the_torch_engine_plays_the_runners_episodes_with_eval_engine_gymnasium(
    tmp_path, capsys
):
    """A run on the default engine (recurrl's torch CartPole): `recurrl eval --engine
    gymnasium` plays gymnasium's episodes for a seed, the ones the runner plays."""
    _need("onnx")
    run_dir = _fixed_run(tmp_path, "--engine", "auto")
    path = tmp_path / "p.onnx"
    assert main(["export", str(run_dir), "-o", str(path)]) == 0
    returns = _load_runner().run_episodes(path, episodes=5, seed=4)
    assert returns == evaluate(run_dir, episodes=5, seed=4, engine="gymnasium")
    assert len(set(returns)) > 1
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "5", "--seed", "4", "--engine",
                 "gymnasium"]) == 0  # fmt: skip
    mean = sum(returns) / len(returns)
    assert f"mean_return: {mean:.2f}" in capsys.readouterr().out


def test_cli_options_and_errors(tmp_path, capsys):
    run_dir = _fixed_run(tmp_path)
    out = tmp_path / "p.pt2"
    argv = ["export", str(run_dir), "--format", "pt2", "-o", str(out), "--batch", "dynamic",
            "--logits", "--value"]  # fmt: skip
    assert main(argv) == 0
    meta = read_metadata(out)
    assert [e["name"] for e in meta["outputs"]] == [
        "action", "logits", "state_value", "next_actor_h", "next_actor_c", "next_critic_h",
        "next_critic_c",
    ]  # fmt: skip
    program = torch.export.load(out).module()
    obs = torch.randn(5, 4)
    states = [torch.zeros(5, 1, 8) for _ in range(4)]
    action, logits, value, *_ = program(obs, torch.ones(5, 1, dtype=torch.bool), *states)
    assert action.shape == (5,) and logits.shape == (5, 2) and value.shape == (5, 1)
    with pytest.raises(SystemExit):
        main(["export", str(run_dir), "--batch", "0"])
    assert "positive int or 'dynamic'" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_dqn_run_exports_its_argmax(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = parse_train("--algo", "dqn", "--hidden-size", "8", "--memory", "gru")
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    from recurrl.trainers.encoders import observation_inputs
    from recurrl.trainers.models import QNetwork

    env = make_env(cfg.env, num_envs=1)
    model = QNetwork(cfg.model, observation_inputs(env), env.action_spec.n,
                     obs_scale=cfg.dqn.obs_scale)  # fmt: skip
    env.close()
    ckpt.write_file(run_dir / ckpt.CHECKPOINT, {"model": model.state_dict()})
    assert main(["export", str(run_dir), "--value"]) == 2
    assert "no state value" in capsys.readouterr().err
    out = tmp_path / "q.pt2"
    assert main(["export", str(run_dir), "--format", "pt2", "-o", str(out), "--logits"]) == 0
    program = torch.export.load(out).module()
    obs = torch.randn(1, 4)
    action, values, _ = program(obs, torch.ones(1, 1, dtype=torch.bool), torch.zeros(1, 1, 8))
    assert torch.equal(action, values.argmax(-1))
    expected = model.q(_step(obs[:, [0, 2]], model))["action_value"]
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("fmt", "encoder"), [("onnx", "cnn"), ("pt2", "cnn"), ("onnx", "onehot"),
                                              ("pt2", "onehot")])  # fmt: skip
def test_image_encoder_and_one_hot_transform_are_inside_the_graph(tmp_path, fmt, encoder):
    """A CNN (or the one-hot grid encoder, MiniGrid's recipe) over uint8 pixels and an env's
    OneHotObservation (discrete observation in) run inside the graph: the exported step
    equals the eager transform + policy."""
    _need(fmt)
    from tensordict import TensorDict

    from recurrl.envs import GymEnv, OneHotObservation, TransformedEnv
    from recurrl.trainers.encoders import ObsInputs

    env = TransformedEnv(GymEnv("FrozenLake-v1"), OneHotObservation())
    one_hot = env.transform[0]
    assert env.observation_spec["observation"].shape == (16,)  # sizes read from the spec
    torch.manual_seed(0)
    cfg = ModelConfig(memory="gru", hidden_size=8, image_encoder=encoder)
    model = ActorCritic(cfg, ObsInputs(16, (7, 7, 3)), 4)
    raw = torch.tensor([5, 11])
    high = 255 if encoder == "cnn" else 11  # the one-hot encoder's entries are indices
    pixels = torch.randint(0, high, (2, 7, 7, 3), dtype=torch.uint8)
    example = TensorDict(observation=raw, pixels=pixels, batch_size=[2])
    meta = export_policy(
        model.policy(True),
        example,
        tmp_path / f"p.{fmt}",
        format=fmt,
        batch="dynamic",
        transforms=[one_hot],
        outputs=("action", "logits"),
    )
    assert [(e["name"], e["dtype"]) for e in meta["inputs"][:3]] == [
        ("observation", "int64"), ("pixels", "uint8"), ("is_init", "bool")]  # fmt: skip
    state = torch.randn(2, 1, 8)
    is_init = torch.tensor([[True], [False]])
    action, logits, _ = _runner(tmp_path / f"p.{fmt}", fmt)([raw, pixels, is_init, state])
    eager = TensorDict(observation=one_hot._apply_transform(raw), pixels=pixels,
                       is_init=is_init, actor_h=state, batch_size=[2])  # fmt: skip
    eager = model.policy(True)(eager)
    torch.testing.assert_close(logits, eager["logits"], atol=1e-5, rtol=1e-5)
    assert torch.equal(action, eager["action"])
    env.close()
