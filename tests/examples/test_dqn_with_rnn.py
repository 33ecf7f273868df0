"""The ported tutorial "Recurrent DQN: training recurrent policies" runs end to end."""

import math

import pytest
import torch

from recurrl.examples import dqn_with_rnn


@pytest.fixture
def one_thread():
    # the shared test machines oversubscribe torch's thread pool: 1 thread is ~20x faster
    # for the per-frame image ops of this example
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # ~15 s of CPU: conv nets on rendered frames
def test_short_run_trains_and_evaluates(capsys, one_thread):
    torch.manual_seed(0)
    lens = dqn_with_rnn.main(
        total_frames=200,
        utd=2,
        warmup_frames=50,
        buffer_size=1000,
        slice_len=10,
        batch_size=20,
        prefetch=2,
        init_stats_frames=60,
        eval_max_steps=30,
        progress=False,
        verbose=True,
    )
    assert len(lens) == 4  # one greedy episode after every batch from the warm-up on
    assert all(1 <= n <= 30 for n in lens)
    out = capsys.readouterr().out
    assert "in_keys ['embed', 'recurrent_state_h', 'recurrent_state_c', 'is_init']" in out
    assert "A sampled batch" in out and "recurrent_state_h" in out


def test_agent_wiring_matches_the_tutorial(one_thread):
    env = dqn_with_rnn.make_env(torch.device("cpu"), init_stats_frames=30)
    norm = env.transform[-1]
    assert norm.loc.shape == (1, 84) and norm.scale.shape == (1, 84)  # one per image column
    agent = dqn_with_rnn.make_agent(env, torch.device("cpu"))
    assert env.observation_spec["pixels"].shape == (1, 84, 84)
    assert "recurrent_state_h" in env.observation_spec  # the LSTM's primer was appended
    td = agent.stoch_policy(env.reset())
    assert td["action"].shape == () and td["action_value"].shape == (2,)
    assert td["next", "recurrent_state_h"].shape == (1, 128)
    assert math.isclose(float(agent.exploration_module.eps), 0.2, abs_tol=1e-7)
    env.close()
