"""One sb3-contrib ``RecurrentPPO`` run, for ``sb3_compare.py``: train for a number of frames,
evaluate the greedy policy on unseen episodes, write a JSON of the figures.

Runs in its own virtual environment (``sb3_compare.py --setup`` makes it); it imports
neither recurrl nor anything of it, so the peer trains as its own users run it. Usage::

    python _sb3_worker.py --env popgym-RepeatPreviousEasy-v0 --seed 5 --frames 100000 \\
        --out run.json

Env ids as ``recurrl train --env`` takes them: ``popgym-...`` (popgym's registered envs) and
``minigrid:MiniGrid-...``. MiniGrid's observation is given as recurrl's networks see it (the
7x7x3 view's entries, divided by 10 here, and the one-hot direction; the mission text left
out), flattened for the MLP-LSTM policy (sb3's CNN needs images of at least 36x36).
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch


class FlatMiniGrid(gym.ObservationWrapper):
    """MiniGrid's view and direction as one float vector: 147 entries / 10, then 4 one-hot."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (7 * 7 * 3 + 4,), np.float32)

    def observation(self, observation: dict) -> np.ndarray:
        view = observation["image"].reshape(-1).astype(np.float32) / 10.0
        direction = np.zeros(4, np.float32)
        direction[int(observation["direction"])] = 1.0
        return np.concatenate([view, direction])


def make_env(env_id: str) -> gym.Env:
    if env_id.startswith("minigrid:"):
        import minigrid  # noqa: F401  (registers MiniGrid's envs)

        return FlatMiniGrid(gym.make(env_id.split(":", 1)[1]))
    import popgym  # noqa: F401  (registers popgym's envs)

    return gym.make(env_id)


def evaluate(model, env_id: str, seed: int, episodes: int) -> list[float]:
    """Greedy returns of ``episodes`` episodes from seeds never trained on, the LSTM state
    carried through each episode and cleared at its start."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    env = DummyVecEnv([lambda: make_env(env_id)])
    env.seed(1_000_003 + seed)  # training seeds its envs from `seed` upwards
    obs = env.reset()
    state, start = None, np.ones((1,), dtype=bool)
    returns, total = [], 0.0
    while len(returns) < episodes:
        action, state = model.predict(obs, state=state, episode_start=start, deterministic=True)
        obs, reward, done, _ = env.step(action)
        total += float(reward[0])
        start = done
        if done[0]:
            returns.append(total)
            total = 0.0
    return returns


def _progress_callback(progress, began: float):
    """A callback writing, after each rollout, the frames so far, the seconds since training
    began and the mean return of the last 20 finished episodes: a run stopped before its end
    still leaves its learning curve."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Progress(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            recent = [float(info["r"]) for info in list(self.model.ep_info_buffer)[-20:]]
            mean = f"{np.mean(recent):.4f}" if recent else ""
            progress.write(f"{self.model.num_timesteps},{time.perf_counter() - began:.1f},{mean}\n")
            progress.flush()

    return Progress()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--envs", type=int, default=8, help="training envs (DummyVecEnv)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-steps", type=int, default=128, help="steps per env per rollout")
    parser.add_argument("--batch-size", type=int, default=128, help="frames per minibatch")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--eval-episodes", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import sb3_contrib
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(lambda: make_env(args.env), n_envs=args.envs, seed=args.seed)
    progress = open(args.out + ".progress.csv", "w")  # noqa: SIM115  (closed below)
    progress.write("frames,time_s,train_return\n")
    hyper = {"n_steps": args.n_steps, "batch_size": args.batch_size, "n_epochs": args.epochs}
    model = RecurrentPPO("MlpLstmPolicy", venv, seed=args.seed, device="cpu", verbose=0, **hyper)
    began = time.perf_counter()
    model.learn(total_timesteps=args.frames, callback=_progress_callback(progress, began))
    train_s = time.perf_counter() - began
    progress.close()
    recent = [float(info["r"]) for info in list(model.ep_info_buffer)[-20:]]
    returns = evaluate(model, args.env, args.seed, args.eval_episodes)
    result = {
        "env": args.env, "seed": args.seed, "frames": int(model.num_timesteps),
        "train_s": train_s, "final_train_return": float(np.mean(recent)) if recent else None,
        "eval_returns": returns, "eval_mean": float(np.mean(returns)),
        "sb3_contrib": sb3_contrib.__version__, "envs": args.envs,
        "hyperparameters": {**hyper, "others": "RecurrentPPO's defaults (MlpLstmPolicy, "
                            "LSTM 256, lr 3e-4, gamma 0.99, GAE 0.95, clip 0.2)"},
    }  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
