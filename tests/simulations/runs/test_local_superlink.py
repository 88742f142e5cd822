"""fedlmc's local SuperLink is Flower's: the same command (from Flower's own source), ports and
paths, found again by its log file. Starting and stopping it for real is the slow test
``tests/project/test_deployment_local.py::test_the_pages_local_simulation_with_fedlmc_superlink``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from flwr.cli import constant
from flwr.cli import local_superlink as flower
from flwr.common.constant import FLWR_DIR, FLWR_HOME, ISOLATION_MODE_SUBPROCESS

from fedlmc.simulations.runs.local_superlink import (
    SUPERLINK,
    LocalSuperLink,
    local_superlink,
    stop_local_superlink,
    superlink_pids,
)


def flowers_command() -> list[str]:
    """The ``command = [...]`` list of Flower's ``_start_local_superlink``, its names resolved
    (the constants of ``flwr.cli.constant``) and its two paths left as placeholders."""
    tree = ast.parse(inspect.getsource(flower._start_local_superlink))
    listing = next(
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "command"
    )
    names = {**vars(constant), "ISOLATION_MODE_SUBPROCESS": ISOLATION_MODE_SUBPROCESS}
    words = []
    for item in listing.elts:
        if isinstance(item, ast.Constant):
            words.append(item.value)
        elif isinstance(item, ast.Name):
            words.append(str(names[item.id]))
        else:  # str(log_file_path)
            words.append("LOG")
    extra = ast.unparse(next(n for n in ast.walk(tree) if isinstance(n, ast.AugAssign)))
    assert extra == "command += ['--database', str(database_path)]"
    return [*words, "--database", "DB"]


def test_the_command_ports_and_paths_are_flowers(tmp_path):
    link = local_superlink({FLWR_HOME: str(tmp_path)})
    assert link.http_port == constant.LOCAL_SUPERLINK_HTTP_API_PORT
    assert f"127.0.0.1:{link.control_port}" == constant.LOCAL_CONTROL_API_ADDRESS
    assert link.health_url.endswith(f":{constant.LOCAL_SUPERLINK_HTTP_API_PORT}/health")
    assert flower.LOCAL_SUPERLINK_STARTUP_TIMEOUT == 15.0  # the wait this module outlasts
    ours = link.command(SUPERLINK)
    assert ours[-1] == "--disable-runtime-dependency-installation"
    paths = {str(link.log_file): "LOG", str(link.runtime_dir / "state.db"): "DB"}
    assert [paths.get(word, word) for word in ours[:-1]] == flowers_command()
    assert local_superlink({}).home == Path.home() / FLWR_DIR
    moved = local_superlink(
        {"FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "40001", "FLWR_LOCAL_CONTROL_API_PORT": "40003"}
    )
    assert (moved.http_port, moved.control_port) == ("40001", "40003")


def test_its_processes_are_found_by_their_log_file_only(tmp_path):
    link = LocalSuperLink(tmp_path / "a", "39091", "39093")
    other = LocalSuperLink(tmp_path / "b", "39091", "39093")
    ps = "\n".join(
        [
            f" 101 /venv/bin/python3 /venv/bin/{SUPERLINK} --log-file {link.log_file} x",
            f" 102 /venv/bin/python3 /venv/bin/{SUPERLINK} --log-file {other.log_file}",
            f" 103 /venv/bin/flower-superexec --insecure --log-file {link.log_file}",
            " 104 vim notes.txt",
        ]
    )
    assert superlink_pids(link, ps) == [101]
    assert superlink_pids(other, ps) == [102]


def test_stopping_when_none_runs_says_so(tmp_path):
    told: list[str] = []
    link = LocalSuperLink(tmp_path, "1", "2")  # no such log file in any process
    assert stop_local_superlink(link, say=told.append) == []
    assert told == [f"no local SuperLink of {tmp_path} runs"]
