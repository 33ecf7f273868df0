"""Run a policy exported by ``recurrl export`` in a gymnasium env, without torch.

Needs numpy, onnxruntime and gymnasium only (no torch, no recurrl)::

    recurrl export runs/my-run --format onnx            # writes runs/my-run/policy.onnx
    python examples/deploy/run_onnx.py runs/my-run/policy.onnx --episodes 10 --seed 1

The exported graph is the policy's acting step as a pure function::

    (observation, is_init, *states[, action_noise]) -> (action, ..., *next_states)

This script carries the states from step to step (``next_<state>`` feeds ``<state>``),
sets ``is_init`` True at every episode start (the graph then resets the state to zeros
itself), and feeds gymnasium's raw observation: recurrl's observation masking (e.g.
CartPole-masked's) and one-hot encoding are inside the graph. Episode ``i`` starts from
``env.reset(seed=seed + i)``, as ``recurrl eval --seed SEED`` seeds its ``i``-th env, so a
run trained with ``--engine gymnasium`` gives the same returns episode by episode as
``recurrl eval`` (greedy).

Input and output names, shapes and roles come from the metadata ``recurrl export`` writes
into the file (and beside it, ``policy.onnx.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gymnasium
import numpy as np
import onnxruntime as ort

META_KEY = "recurrl.export"
DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "bool": np.bool_,
          "uint8": np.uint8, "int32": np.int32}  # fmt: skip


def load_policy(path: str | Path, threads: int = 1) -> tuple[ort.InferenceSession, dict]:
    """The onnxruntime session of an exported policy and its metadata."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    meta_map = session.get_modelmeta().custom_metadata_map
    if META_KEY in meta_map:
        return session, json.loads(meta_map[META_KEY])
    beside = Path(f"{path}.json")
    if not beside.is_file():
        sys.exit(f"run_onnx: {path} holds no recurrl metadata and {beside} does not exist.")
    return session, json.loads(beside.read_text())


def _zeros(entry: dict) -> np.ndarray:
    shape = [1 if d == "batch" else d for d in entry["shape"]]
    return np.zeros(shape, dtype=DTYPES[entry["dtype"]])


def _action(value: np.ndarray, meta: dict) -> object:
    """One env's action from the graph's ``action`` row: an int, or an array."""
    space = meta.get("action", {}).get("space", "discrete" if value.ndim == 1 else "box")
    if space == "discrete":
        return int(value[0])
    return np.asarray(value[0])


def run_episodes(
    path: str | Path,
    *,
    env_id: str | None = None,
    episodes: int = 10,
    seed: int = 0,
    threads: int = 1,
    max_steps: int = 100_000,
) -> list[float]:
    """The returns of ``episodes`` episodes of the exported policy at ``path``.

    Args:
        path: an ONNX file written by ``recurrl export`` (batch 1 or dynamic).
        env_id: the gymnasium id; default: the one the run trained on (metadata).
        episodes: episodes to run, one after the other in one env.
        seed: episode ``i`` starts from ``env.reset(seed=seed + i)``; the noise of a
            ``--sample`` export is drawn from ``numpy.random.default_rng(seed)``.
        threads: onnxruntime's intra-op threads.
        max_steps: give up when an episode is longer than this.
    """
    session, meta = load_policy(path, threads)
    env_meta = meta.get("env", {})
    env_id = env_id or env_meta.get("gym_id")
    if env_id is None:
        sys.exit("run_onnx: the metadata names no env (a policy exported from code): pass --env.")
    inputs = meta["inputs"]
    observations = [e for e in inputs if e["role"] == "observation"]
    if len(observations) != 1:
        names = [e["name"] for e in observations]
        sys.exit(
            f"run_onnx: the graph reads {len(observations)} observation inputs {names}; this "
            f"runner feeds one (gymnasium's observation). Dict / image observations are "
            f"flattened by recurrl's NetworkInputs wrapper, outside the graph."
        )
    obs_entry = observations[0]
    next_of = {e["state_input"]: e["name"] for e in meta["outputs"] if e["role"] == "next_state"}
    out_names = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(seed)
    kwargs = {}
    if env_meta.get("max_episode_steps") is not None:
        kwargs["max_episode_steps"] = env_meta["max_episode_steps"]
    env = gymnasium.make(env_id, **kwargs)
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            states = {e["name"]: _zeros(e) for e in inputs if e["role"] == "state"}
            is_init, total = True, 0.0
            for _ in range(max_steps):
                feed = {
                    obs_entry["name"]: np.asarray(obs, dtype=DTYPES[obs_entry["dtype"]]).reshape(
                        [1 if d == "batch" else d for d in obs_entry["shape"]]),
                    "is_init": np.array([[is_init]]),
                    **states,
                }  # fmt: skip
                for e in inputs:
                    if e["role"] == "noise":
                        shape = [1 if d == "batch" else d for d in e["shape"]]
                        normal = e["name"] in {n["input"] for n in meta["noise"]
                                               if n["distribution"].startswith("normal")}
                        draw = rng.standard_normal(shape) if normal else rng.random(shape)
                        feed[e["name"]] = draw.astype(DTYPES[e["dtype"]])
                out = dict(zip(out_names, session.run(None, feed), strict=True))
                obs, reward, terminated, truncated, _ = env.step(_action(out["action"], meta))
                total += float(reward)
                states = {name: out[next_of[name]] for name in states}
                is_init = False
                if terminated or truncated:
                    break
            else:
                raise RuntimeError(f"run_onnx: an episode ran past max_steps={max_steps}.")
            returns.append(total)
    finally:
        env.close()
    return returns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the .onnx file written by `recurrl export`")
    parser.add_argument("--env", default=None, help="gymnasium id (default: the run's)")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="episode i: reset(seed=SEED + i)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads")
    args = parser.parse_args(argv)
    returns = run_episodes(
        args.model, env_id=args.env, episodes=args.episodes, seed=args.seed, threads=args.threads
    )
    for i, ret in enumerate(returns):
        print(f"episode {i} (seed {args.seed + i}): return {ret:g}")
    print(f"mean_return: {np.mean(returns):.2f} ± {np.std(returns):.2f} over {len(returns)} "
          f"episodes")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
