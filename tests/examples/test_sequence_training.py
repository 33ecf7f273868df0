"""The end-to-end pipeline: collector -> replay buffer -> slices -> recurrent-mode training."""

import re

from recurrl.examples import sequence_training


def test_pipeline_replays_exactly_and_memory_beats_feed_forward(capsys):
    assert sequence_training.main(["--steps", "200"]) == 0
    out = capsys.readouterr().out
    # the same function up to float rounding (auto: the C++ step while acting, the C++
    # sequence loop when replaying)
    err = float(re.search(r"replayed features match the collected ones to (\S+)", out)[1])
    assert err <= 1e-6
    assert "memory helps" in out
