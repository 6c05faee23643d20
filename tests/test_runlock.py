"""One process at a time trains in a run folder (src/rollwise/runlock.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from rollwise.cli import main
from rollwise.runlock import lock_run_dir

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rollwise.runlock import lock_run_dir
    lock_run_dir(Path(sys.argv[1]))
    print("locked", flush=True)
    time.sleep(600)
""")


def _hold(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_process_in_the_same_run_folder_is_refused_and_a_dead_one_frees_it(tmp_path, capsys):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("run: {name: x}\n")
    holder = _hold(run)
    try:
        # a fresh start with the same run.name, and a resume, while the first process still trains
        assert main(["train", f"run.output_dir={tmp_path / 'runs'}", "run.name=x"]) == 2
        err = capsys.readouterr().err
        assert f"{run} is in use by process {holder.pid}, which is training in it" in err
        assert main(["train", "--resume", str(run)]) == 2
        assert f"in use by process {holder.pid}" in capsys.readouterr().err
        assert (run / "config.yaml").read_text() == "run: {name: x}\n"  # nothing was written
    finally:
        holder.kill()  # SIGKILL: the system drops the lock with the process
        holder.wait()
    lock_run_dir(run)  # free again; and the same process may take it twice
    lock_run_dir(run)
