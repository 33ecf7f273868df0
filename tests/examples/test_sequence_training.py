"""The end-to-end pipeline: collector -> replay buffer -> slices -> recurrent-mode training."""

from recurrl.examples import sequence_training


def test_pipeline_replays_exactly_and_memory_beats_feed_forward(capsys):
    assert sequence_training.main(["--steps", "200"]) == 0
    out = capsys.readouterr().out
    assert "replayed features match the collected ones to 0.0e+00" in out
    assert "memory helps" in out
