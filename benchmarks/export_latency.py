"""Batch-1 acting-step latency: an exported policy under onnxruntime vs the eager recurrl step.

The policy is ``recurrl train``'s default actor (CartPole-masked: 2 observations, an LSTM
trunk of 64 units, an MLP head, the greedy action) built by
:class:`~recurrl.trainers.models.ActorCritic`. Both sides run one step of one env on one
thread, each carrying its state from call to call:

* ``eager``: the policy on a TensorDict (the collector's call: observation scaling, the LSTM's
  sequential step, the head, the mode of the categorical), its ``("next", state)`` entries
  moved to the state keys between calls;
* ``onnxruntime``: ``InferenceSession.run`` on numpy arrays of the file ``recurrl export``
  writes (``--format onnx``), one intra-op thread, next states fed back;
* ``torch.export``: the ``.pt2`` program's module called on tensors (for reference).

Run: ``python benchmarks/export_latency.py [--memory lstm] [--clock thread]``
(needs the ``export`` extra for the onnxruntime line).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import compare

from recurrl.modules import RecurrentModule
from recurrl.trainers.config import ModelConfig
from recurrl.trainers.export import export_policy
from recurrl.trainers.models import ActorCritic

OBS, ACTIONS = 2, 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", default="lstm", choices=["lstm", "gru", "mingru", "lru"])
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--inner", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ActorCritic(ModelConfig(memory=args.memory, hidden_size=args.hidden_size), OBS,
                        ACTIONS).eval()  # fmt: skip
    policy = model.policy(True)
    obs = torch.randn(1, OBS)
    td = TensorDict(observation=obs, is_init=torch.ones(1, 1, dtype=torch.bool), batch_size=[1])
    state_keys = [k for m in policy.modules() if isinstance(m, RecurrentModule)
                  for k in m.state_keys]  # fmt: skip

    def eager() -> None:
        with torch.no_grad():
            out = policy(td)
        for key in state_keys:
            td.set(key, out.get(("next", key)))
        td.set("is_init", torch.zeros(1, 1, dtype=torch.bool))

    fns = {"eager": eager}
    with tempfile.TemporaryDirectory() as tmp:
        meta = export_policy(policy, td.clone(), f"{tmp}/p.pt2", format="pt2")
        program = torch.export.load(f"{tmp}/p.pt2").module()
        names = [e["name"] for e in meta["inputs"]]
        feed_t = {"observation": obs, "is_init": torch.zeros(1, 1, dtype=torch.bool)}
        feed_t.update({e["name"]: torch.zeros(e["shape"]) for e in meta["inputs"]
                       if e["role"] == "state"})  # fmt: skip
        n_states = len(names) - 2

        def exported() -> None:
            with torch.no_grad():
                out = program(*(feed_t[n] for n in names))
            for name, value in zip(names[2:], out[len(out) - n_states :], strict=True):
                feed_t[name] = value

        fns["torch.export"] = exported
        try:
            import onnxruntime as ort
        except ImportError:
            print("onnxruntime: not installed (pip install 'recurrl[export]')")
        else:
            export_policy(policy, td.clone(), f"{tmp}/p.onnx")
            options = ort.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            session = ort.InferenceSession(f"{tmp}/p.onnx", options,
                                           providers=["CPUExecutionProvider"])  # fmt: skip
            feed = {n: v.numpy() for n, v in feed_t.items()}

            def onnx() -> None:
                out = session.run(None, feed)
                for name, value in zip(names[2:], out[len(out) - n_states :], strict=True):
                    feed[name] = value

            fns["onnxruntime"] = onnx
        clock = time.thread_time if args.clock == "thread" else time.perf_counter
        times = compare(fns, rounds=args.rounds, inner=args.inner, clock=clock)
    print(f"batch-1 acting step, {args.memory} H={args.hidden_size}, 1 thread, {args.clock} "
          f"clock (median of {args.rounds} rounds x {args.inner} steps):")  # fmt: skip
    for name, seconds in times.items():
        print(f"  {name:<13} {seconds * 1e6:8.1f} us/step  ({times['eager'] / seconds:.2f}x eager)")


if __name__ == "__main__":
    main()
