"""The ported pipeline example: a GRU Q-network, a collector thread writing into a replay
buffer, padded slices found by their trajectory ids, recurrent mode over the flat sample."""

from __future__ import annotations

import re
import threading

from recurrl.examples import recurrent_slice_sampler_pipeline as pipeline


def test_the_pipeline_runs_and_stops_its_thread(capsys):
    assert pipeline.main(["--train-steps", "3", "--frames-per-batch", "50"]) == 0
    out = capsys.readouterr().out
    assert "trajectory key found by the sampler: ('collector', 'traj_ids')" in out
    steps = re.findall(r"step (\d): write_count=(\d+) slice lengths=\[(.*)\] loss=([\d.]+)", out)
    assert [s[0] for s in steps] == ["0", "1", "2"]
    for _, count, lengths, _ in steps:
        assert int(count) >= 64  # the loop waited for one batch of steps
        assert all(1 <= int(n) <= 16 for n in lengths.split(","))  # padded, never dropped
    assert not [t for t in threading.enumerate() if t.name.startswith("recurrl-")]
