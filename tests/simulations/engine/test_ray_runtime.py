"""A local Ray that cannot start ends a command with one line saying what Ray reported and what
to do, whatever Ray raised (a real start that fails at once: Ray's temporary folder is a
file), and nothing of the results is lost; a start-up wait that ran out names the machine's
load."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedlmc.simulations.cli import main
from fedlmc.simulations.engine.ray_runtime import start_failure

ROOT = Path(__file__).resolve().parents[3]
SWEEP = 'name = "s"\n[run]\nepochs = 1\nmethods = "average"\n'
RAY_TIMEOUT = (  # what Ray 2.55's Node raises when its raylet does not register within 30 s
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


def test_a_ray_that_cannot_start_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("RAY_TMPDIR", str(blocker))  # where Ray makes its session folder
    config = tmp_path / "s.toml"
    config.write_text(SWEEP)
    out = tmp_path / "out"
    assert main(["sweep", str(config), "--out", str(out), "--quiet", "--no-report"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("fedlmc: error: Ray did not start (NotADirectoryError")
    assert err[0].endswith("fix the cause above and try again; rerun the same command to resume")
    assert not (out / "results.csv").exists()
    assert main(["run", "epochs=1", "methods=average"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fedlmc: error: the federation failed: FederationError: Ray did")
    assert "Traceback" not in "\n".join(err)


def test_a_start_up_wait_that_ran_out_names_the_load_and_what_to_do():
    line = start_failure(Exception(RAY_TIMEOUT))
    assert line.startswith("Ray did not start (Exception: The current node timed out")
    assert "this machine is loaded (load average " in line and " cores)" in line
    assert line.endswith("nothing ran; try again when it is quieter") and "\n" not in line


@pytest.mark.slow
def test_a_failed_start_leaves_ray_out_of_token_mode(tmp_path):
    """A local Ray that does not start (Ray's temporary folder is a file) leaves this process's
    Ray as it found it: not in token mode, so a later plain ``ray.init`` of the process (a
    notebook's, Flower's ``run_simulation``) is not refused by its own node. Before, the failed
    start left the token mode on (the successful path already reset it). In a fresh interpreter:
    the mode is per process."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    code = textwrap.dedent(
        """
        from ray._raylet import AuthenticationMode, get_authentication_mode
        from fedlmc.simulations.engine import ray_runtime

        try:
            ray_runtime.start_local_ray({"address": "local", "num_cpus": 1}, 1)
        except ray_runtime.RayStartError as err:
            print("refused", str(err).startswith("Ray did not start (NotADirectoryError"))
        print("token mode", get_authentication_mode() == AuthenticationMode.TOKEN)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME="/nonexistent", RAY_TMPDIR=str(blocker))  # no ~/.ray/auth_token
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )
    assert out.stdout.splitlines() == ["refused True", "token mode False"], out.stderr[-2000:]
