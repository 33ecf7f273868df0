"""The run directory lock: one live holder at a time; a dead holder never blocks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from recurrl.trainers.errors import UsageError
from recurrl.trainers.run_lock import LOCK, RunLocked, lock_run_dir


def test_a_second_holder_is_refused_until_the_first_releases(tmp_path):
    with lock_run_dir(tmp_path):
        assert (tmp_path / LOCK).read_text() == f"{os.getpid()}\n"
        match = rf"pid {os.getpid()}\) is training in"
        with pytest.raises(RunLocked, match=match) as info, lock_run_dir(tmp_path):
            pass
        assert isinstance(info.value, UsageError) and "Fix: wait until it ends" in str(info.value)
    with lock_run_dir(tmp_path):  # released at the end of the block
        pass
    with pytest.raises(RuntimeError), lock_run_dir(tmp_path):  # ... and when it fails
        raise RuntimeError
    with lock_run_dir(tmp_path):
        pass


@pytest.mark.slow  # a subprocess killed mid-run
def test_the_lock_of_a_killed_process_does_not_block(tmp_path):
    holder = textwrap.dedent(f"""
        import sys, time
        from recurrl.trainers.run_lock import lock_run_dir
        with lock_run_dir({str(tmp_path)!r}):
            print("locked", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunLocked, match=f"pid {proc.pid}"), lock_run_dir(tmp_path):
            pass
    finally:
        proc.kill()  # SIGKILL: no cleanup runs in the holder
        proc.wait(timeout=30)
    assert (tmp_path / LOCK).read_text() == f"{proc.pid}\n"  # the stale file stays...
    with lock_run_dir(tmp_path):  # ... and does not block
        pass
