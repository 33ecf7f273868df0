"""The collector's fast paths against their oracles: whole batches against a hand loop
over the public env methods, the leaf-by-leaf stacking (``stack_plain``) against
``torch.stack``, and a policy stepping through the ``cpp`` backend's operator against the
default policy."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

from recurrl.collectors import Collector
from recurrl.collectors.collector import _CHUNK_STEPS
from recurrl.envs import Compose, GymEnv, InitTracker, TransformedEnv
from recurrl.modules import LSTMModule, set_recurrent_mode
from recurrl.testing import CountingEnv
from tests.collectors.test_collector import STATE_KEYS, H, collect, make_policy


# --- the collector's loop against the public methods ---------------------------------------
def _public_batches(env, policy, n_batches, steps, offset, stride):
    """Batches collected by hand through ``env.step``, ``env.step_mdp`` and ``env.reset``
    with a ``"_reset"`` mask (the public methods), ids handed out in env order at every
    start: what the collector must return."""
    from recurrl.envs.utils import RESET_KEY

    batch = env.batch_size
    time_dim = len(batch)
    root = env.reset()
    count = batch.numel()
    ids = (torch.arange(count) * stride + offset).reshape(batch)
    out = []
    with torch.no_grad(), set_recurrent_mode(False):
        for _ in range(n_batches):
            tds, traj = [], []
            for _ in range(steps):
                td = env.step(policy(root))
                tds.append(td)
                traj.append(ids)
                root = env.step_mdp(td)
                done = td.get(("next", "done")).reshape(*batch, -1).any(-1)
                if bool(done.any()):
                    root.set(RESET_KEY, done.unsqueeze(-1))
                    fresh = env.reset(root)
                    del root[RESET_KEY]
                    root.update(fresh)
                    starts = int(done.sum())
                    new = torch.arange(count, count + starts) * stride + offset
                    ids = ids.masked_scatter(done, new)
                    count += starts
            data = torch.stack(tds, dim=time_dim)
            data.set(("collector", "traj_ids"), torch.stack(traj, dim=time_dim))
            out.append(data)
    return out


def _twin_envs(kind, rng):
    lstm = make_policy(obs_dim=4 if kind != "counting" else 3)[0]
    if kind == "counting":
        batch = rng.choice([(), (1,), (4,)])
        n = 1 if not batch else batch[0]
        lengths = [rng.randint(1, 6) for _ in range(n)]
        max_steps = lengths[0] if not batch else lengths

        def base():
            return CountingEnv(batch_size=batch, max_steps=max_steps)
    else:
        from recurrl.envs import GymVecEnv

        n = 1 if kind == "gym" else 3

        def base():
            env = GymEnv("CartPole-v1") if n == 1 else GymVecEnv("CartPole-v1", num_envs=n)
            env.set_seed(11)
            return env

    def make():
        return TransformedEnv(base(), Compose(InitTracker(), lstm.make_tensordict_primer()))

    return make(), make(), n


@pytest.mark.parametrize("case", range(12))
def test_batches_equal_the_public_methods_loop(case):
    """Random envs (batch [] or [N], episode lengths, CartPole), batch lengths across
    chunk ends and id layouts: the collector's batches equal, key for key and bit for bit,
    the ones collected by hand through the public methods."""
    import random

    rng = random.Random(case)
    kind = ["counting", "gym", "gym_vector"][case % 3]
    env_a, env_b, n = _twin_envs(kind, rng)
    _, policy = make_policy(obs_dim=4 if kind != "counting" else 3, seed=case)
    steps = rng.choice([1, 7, _CHUNK_STEPS + 3])
    stride = rng.choice([1, 3])
    offset = rng.randrange(stride) if stride > 1 else rng.choice([0, 5])
    collector = Collector(
        env_a, policy, frames_per_batch=steps * n, traj_id_offset=offset, traj_id_stride=stride
    )
    got = [collector.rollout() for _ in range(3)]
    expected = _public_batches(env_b, policy, 3, steps, offset, stride)
    for a, e in zip(got, expected, strict=True):
        assert a.batch_size == e.batch_size
        assert set(a.keys(True, True)) == set(e.keys(True, True))
        for key in e.keys(True, True):
            x, y = a.get(key), e.get(key)
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert torch.equal(x, y), key
    collector.shutdown()
    env_b.close()


# --- stack_plain against torch.stack ------------------------------------------------------
def _random_steps(rng, n_steps):
    """Step TensorDicts of one random layout, with now and then a step that differs (key
    order, a key, dtype, shape, names, lock, a non-plain TensorDict, a sub-TensorDict with
    more dims)."""
    from tensordict import LazyStackedTensorDict

    batch = rng.choice([(), (2,), (3, 2)])
    device = rng.choice([None, torch.device("cpu")])
    keys = rng.sample(["a", "b", "c", "d"], rng.randint(1, 4))
    nested = rng.random() < 0.6

    def step(t):
        entries = {k: torch.full((*batch, 2), float(t)) for k in keys}
        if nested:
            entries["next"] = {"x": torch.full((*batch, 1), t, dtype=torch.int64)}
        return TensorDict(entries, batch_size=batch, device=device)

    steps = [step(t) for t in range(n_steps)]
    odd = rng.choice(["none", "none", "order", "key", "dtype", "shape", "names", "lock",
                      "lazy", "subdims"])  # fmt: skip
    i = rng.randrange(n_steps)
    td = steps[i]
    if odd == "order":
        steps[i] = TensorDict(dict(reversed(list(td.items()))), batch, device=device)
    elif odd == "key":
        td.set("extra", torch.zeros(*batch, 1))
    elif odd == "dtype":
        td.set(keys[0], td.get(keys[0]).double())
    elif odd == "shape":
        td.set(keys[0], torch.zeros(*batch, 3))
    elif odd == "names" and batch:
        for s in steps:
            s.names = ["env", *([None] * (len(batch) - 1))]
    elif odd == "lock":
        td.lock_()
    elif odd == "lazy" and batch:
        steps[i] = LazyStackedTensorDict.lazy_stack(list(td.unbind(0)), 0)
    elif odd == "subdims" and nested:
        sub = TensorDict({"x": torch.zeros(*batch, 1, dtype=torch.int64)}, [*batch, 1])
        td.set("next", sub, inplace=False)
    return steps, len(batch)


@pytest.mark.parametrize("seed", range(40))
def test_stack_plain_equals_torch_stack_or_declines(seed):
    import random

    from recurrl.collectors.collector import stack_plain

    rng = random.Random(seed)
    steps, ndim = _random_steps(rng, rng.choice([1, 3, 5]))
    dim = rng.randint(0, ndim)
    try:
        expected = torch.stack(steps, dim)
    except Exception:  # what does not stack must be declined
        assert stack_plain(steps, dim) is None
        return
    got = stack_plain(steps, dim)
    if got is None:
        return  # declined: the collector stacks with torch.stack
    assert type(got) is type(expected) is TensorDict
    assert got.batch_size == expected.batch_size and got.device == expected.device
    assert got.names == expected.names and not got.is_locked
    assert list(got.keys(True)) == list(expected.keys(True))
    for key in expected.keys(True):
        a, e = got.get(key), expected.get(key)
        if isinstance(e, TensorDict):
            assert a.batch_size == e.batch_size and a.device == e.device, key
            continue
        assert a.dtype == e.dtype and a.shape == e.shape and torch.equal(a, e), key


def test_stack_plain_takes_the_collectors_steps():
    """The collector's own steps take the lean stack (not a silent fallback)."""
    from recurrl.collectors.collector import stack_plain

    taken = []
    _, collector, _ = collect(0)
    original = collector._stack

    def spy(steps, ids):
        taken.append(stack_plain(steps, collector._time_dim) is not None)
        return original(steps, ids)

    collector._stack = spy
    collector.rollout()
    assert taken and all(taken)


# --- a policy whose LSTM steps through the cpp backend's operator -------------------------
def _cpp_or_default_policy(backend: str):
    """The tutorial's policy (``benchmarks/collect.py``'s), with the LSTM module built with
    ``recurrent_backend=backend``; the same weights whatever the backend."""
    torch.manual_seed(0)
    lstm = LSTMModule(
        4,
        H,
        in_keys=["observation", *STATE_KEYS],
        out_keys=["features", *(("next", k) for k in STATE_KEYS)],
        recurrent_backend=backend,
    )
    policy = Seq(
        lstm,
        Mod(nn.Linear(H, 2), in_keys=["features"], out_keys=["logits"]),
        Mod(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    )
    return lstm, policy


@pytest.mark.usefixtures("cpp_extension")  # tests/conftest.py: skipped where it cannot build
@pytest.mark.parametrize("n_envs", [1, 3])
def test_cpp_backend_policy_collects_the_same_batches(n_envs):
    """With ``recurrent_backend="cpp"`` the collector's policy steps through the C++
    operator, and its batches are the default policy's: the same keys, shapes and dtypes,
    the same actions and trajectories on CartPole, the LSTM's features and states within
    float32 rounding (the operator's gates round as the ``cpp`` scan's, not as torch's)."""
    from recurrl.envs import GymVecEnv

    batches = {}
    for backend in ("pad", "cpp"):
        lstm, policy = _cpp_or_default_policy(backend)
        env = GymEnv("CartPole-v1") if n_envs == 1 else GymVecEnv("CartPole-v1", num_envs=n_envs)
        env.set_seed(3)
        collector = Collector(env, policy, frames_per_batch=40 * n_envs)
        batches[backend] = [collector.rollout() for _ in range(2)]
        assert (lstm._step_plan.cpp_step is not None) == (backend == "cpp")
        collector.shutdown()
    for a, e in zip(batches["cpp"], batches["pad"], strict=True):
        assert a.batch_size == e.batch_size
        assert set(a.keys(True, True)) == set(e.keys(True, True))
        for key in e.keys(True, True):
            x, y = a.get(key), e.get(key)
            assert x.dtype == y.dtype and x.shape == y.shape, key
            if x.is_floating_point():
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=str(key))
            else:
                assert torch.equal(x, y), key
    done = torch.cat([b.get(("next", "done")).flatten() for b in batches["pad"]])
    assert done.any()  # the batches cross episode ends: the operator's reset was taken
