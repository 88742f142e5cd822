"""``num-cpus`` above this machine's cores: ``run``, ``sweep`` and ``validate`` refuse it before a
local Ray starts; a cluster joined with ``--ray-address`` is not checked."""

from __future__ import annotations

import os

from fedlmc.simulations.cli import main
from tests.simulations.test_cli import GOOD_SWEEP, GUARD, snapshot


def test_num_cpus_above_this_machines_cores_is_refused_before_ray_starts(
    tmp_path, capsys, monkeypatch
):
    """A client asking more CPUs than this machine has cannot run on a local Ray: ``run``,
    ``sweep`` and ``validate`` refuse it with one line naming the key, the value and the core
    count, exit 2, nothing written and Ray not started (before, Ray started and then found no
    node to host a client). With ``--ray-address`` a cluster's nodes decide: not refused, it
    goes on to Ray (here a stand-in that says so)."""
    import fedlmc.simulations.engine.cells as cells
    import fedlmc.simulations.engine.ray_runtime as ray_runtime

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(ray_runtime, "init_ray", no_ray)
    monkeypatch.setattr(cells, "init_ray", no_ray)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.toml").write_text(GOOD_SWEEP)
    cores = os.cpu_count()
    over = f"num-cpus={cores + 1}"
    line = (
        f"fedlmc: error: num-cpus = {cores + 1}: this machine has {cores} cores; allowed: at "
        f"most {cores} for a client of the local Ray (a cluster joined with --ray-address may "
        "offer more)"
    )
    for argv in (["run", over], ["sweep", "good.toml", over], ["validate", "good.toml", over]):
        before = snapshot(tmp_path)
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        assert captured.err.strip().splitlines() == [line] and captured.out == "", argv
        assert snapshot(tmp_path) == before
    assert main(["validate", "good.toml", f"num-cpus={cores}"]) == 0
    assert main(["run", over, *GUARD]) == 1  # not refused here: it went on to join the cluster
    assert "Ray was started" in capsys.readouterr().err
