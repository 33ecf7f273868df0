"""The main-job example: collected features are reproduced by every recurrent backend."""

from recurrl.examples import replay_check


def test_replay_check_agrees(capsys):
    assert replay_check.main(["--steps", "120", "--hidden", "8"]) == 0
    out = capsys.readouterr().out
    assert "sequential and recurrent outputs agree" in out
    assert out.count("-> agree") == 3  # pad, scan, auto
