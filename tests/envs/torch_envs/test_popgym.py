"""The popgym tasks against popgym's own envs: the torch env is dealt popgym's decks
(its deck draw is replaced by popgym's shuffles), both take the same actions, and every
observation, reward and flag is compared over whole episodes, with partial resets."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from recurrl.envs import CountRecallEnv, RepeatFirstEnv, RepeatPreviousEnv
from recurrl.envs.gym import import_env_package
from recurrl.envs.torch_envs.popgym import card_values
from recurrl.envs.utils import RESET_KEY

pytest.importorskip("popgym")

N = 3
TASKS = {
    "RepeatPrevious": RepeatPreviousEnv,
    "RepeatFirst": RepeatFirstEnv,
    "CountRecall": CountRecallEnv,
}
CASES = [(name, d) for name in TASKS for d in ("easy", "medium", "hard")]


def _popgym(name: str, difficulty: str) -> gymnasium.Env:
    env_id = f"popgym-{name}{difficulty.capitalize()}-v0"
    import_env_package(env_id)
    return gymnasium.make(env_id)


def _dealing_order(env: gymnasium.Env) -> list[np.ndarray]:
    """The card values popgym will deal (it deals from the end of its shuffled indices)."""
    u = env.unwrapped
    if hasattr(u, "value_deck"):  # CountRecall: a value deck and a query deck
        return [u.deck_idx_type[u.value_deck.idx[::-1]], u.deck_idx_type[u.query_deck.idx[::-1]]]
    return [u.deck.suits_idx[u.deck.idx[::-1]]]


class Table:
    """N popgym envs and one torch env of batch N, reset and stepped together."""

    def __init__(self, name: str, difficulty: str) -> None:
        self.pops = [_popgym(name, difficulty) for _ in range(N)]
        self.env = TASKS[name](N, difficulty, seed=0)
        self.queue: list[list[torch.Tensor]] = []
        self.env._draw_decks = self._draw  # deal popgym's decks
        self.seed = 0

    def _draw(self, rows: int) -> list[torch.Tensor]:
        decks = self.queue.pop(0)
        assert all(d.shape[0] == rows for d in decks)
        return decks

    def reset(self, root, rows: list[int]):
        """Reset popgym envs ``rows`` and the torch env's (all: a full reset)."""
        obs = []
        for i in rows:
            self.seed += 1
            obs.append(self.pops[i].reset(seed=self.seed)[0])
        orders = [_dealing_order(self.pops[i]) for i in rows]
        self.queue.append([torch.tensor(np.stack(d)) for d in zip(*orders, strict=True)])
        if root is None:
            root = self.env.reset()
        else:
            mask = torch.zeros(N, 1, dtype=torch.bool)
            mask[rows] = True
            root[RESET_KEY] = mask
            fresh = self.env.reset(root)
            del root[RESET_KEY]
            root.update(fresh)
        assert root["observation"][rows].tolist() == np.stack(obs).tolist()
        assert not self.queue
        return root


@pytest.mark.filterwarnings("ignore:.*share an object")  # popgym's CountRecall infos
@pytest.mark.parametrize(("name", "difficulty"), CASES)
def test_episodes_match_popgym(name, difficulty):
    """Two episodes of env 1 and 2; env 0 is reset after 5 steps, so its episodes end at
    other steps (partial resets both ways)."""
    table = Table(name, difficulty)
    env = table.env
    length = env.num_cards - 1  # popgym's episodes: every card but the first is dealt
    root = table.reset(None, list(range(N)))
    rng = np.random.default_rng(0)
    seen: set[float] = set()
    ends = []
    for t in range(2 * length):
        if t == 5:
            root = table.reset(root, [0])
        action = rng.integers(0, min(env.action_spec.n, 4), N)  # small counts: hits
        out = [p.step(int(a)) for p, a in zip(table.pops, action, strict=True)]
        root["action"] = torch.from_numpy(action)
        td = env.step(root)
        nxt = td["next"]
        obs = np.stack([np.asarray(o[0]) for o in out])
        reward = np.array([o[1] for o in out], dtype=np.float32)
        terminated = np.array([o[2] for o in out])
        assert nxt["observation"].tolist() == obs.tolist(), t
        assert nxt["reward"].squeeze(-1).tolist() == reward.tolist(), t
        assert nxt["terminated"].squeeze(-1).tolist() == terminated.tolist(), t
        assert not nxt["truncated"].any() and not any(o[3] for o in out)
        seen |= set(np.sign(reward).tolist())
        root = env.step_mdp(td)
        if terminated.any():
            ends.append((t, np.flatnonzero(terminated).tolist()))
            root = table.reset(root, np.flatnonzero(terminated).tolist())
    assert ends[:2] == [(length - 1, [1, 2]), (length + 4, [0])]
    assert {1.0, -1.0} <= seen


@pytest.mark.parametrize(("name", "difficulty"), CASES)
def test_specs_rewards_and_lengths(name, difficulty):
    """Episode length, reward scale and the return of a perfect / a wrong player."""
    env = TASKS[name](2, difficulty, seed=1)
    length = env.num_cards - 1
    root = env.reset()
    total = torch.zeros(2)
    for t in range(length):
        deck = env.decks
        if name == "RepeatPrevious":
            target = deck[0][:, max(t + 1 - env.k, 0)].long()
        elif name == "RepeatFirst":
            target = deck[0][:, 0].long()
        else:
            target = env.counts.gather(1, root["observation"][:, 1:]).squeeze(-1)
        root["action"] = target
        td, root = env.step_and_maybe_reset(root)
        total += td["next", "reward"].squeeze(-1)
        assert td["next", "done"].all() == (t == length - 1)
    torch.testing.assert_close(total, torch.ones(2))  # popgym's returns are in [-1, 1]


def test_card_values_are_popgyms_decks():
    from popgym.core.deck import Deck

    for num_decks in (1, 3):
        deck = Deck(num_decks)
        for kind in ("suits", "ranks", "colors"):
            expected = getattr(deck, f"{kind}_idx")
            assert card_values(num_decks, kind).tolist() == expected.tolist()


def test_decks_are_shuffles_of_the_cards():
    env = CountRecallEnv(64, "hard", seed=0)
    env.reset()
    values = card_values(4, "ranks")
    for deck in env.decks:
        counts = torch.nn.functional.one_hot(deck.long(), 13).sum(1)
        assert (counts == torch.bincount(values)).all()
    first = env.decks[0].long()
    assert not (first[1:] == first[0]).all(1).any()  # different orders per env
    assert not torch.equal(env.decks[0], env.decks[1])  # the two decks are independent
