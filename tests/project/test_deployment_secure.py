"""A SuperNode killed during the SecAgg+ round of a real loopback deployment.

The SuperLink and three SuperNodes of docs/federation.md's loopback blocks (started as
tests/project/test_deployment.py starts them: free ports, a temporary ``FLWR_HOME``, every process
in its own group, stopped by pid when the test ends), one ``flwr run`` of the secure plain average
over all three (``secure-aggregation = "secagg+"``, a tiny MLP, one epoch, no calibration), and
partition 2's SuperNode killed (its process group, ``SIGKILL``) as soon as its own log shows its
second reply sent (setup, share keys): it has shared its keys and drops in SecAgg+'s masked-vector
stage, the case SecAgg+'s key shares are for. Partition 2 is also told to hang in that stage (the
documented test-only ``inject-failure = "hang:2"``), so that however late the kill comes, it cannot
come after its masked vector. The SuperLink answers the dead node's message with its "Node
Unavailable" error once the node's heartbeats stop (16 to 20 s after the kill with the tests'
``NODE_HEARTBEAT`` of 10 s; 36 to 60 s with Flower's default). Fewer survivors than the threshold,
and drops at the other stages, are tested in process (tests/strategies/test_secure_dropped.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from tests.project.test_deployment import (
    BIN,
    PAGE,
    RUN_TIMEOUT,
    TEST_BOUND,
    TINY_MODEL,
    node_id_of,
    page_deployment,
    start_deployment,
    wait_for_replies,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TEST_BOUND)]  # docs/development.md

KEYS_SHARED = 2
"""SecAgg+'s stages reach a node as ``train`` messages: setup, share keys, masked vectors
(where the client trains), unmask. A node that has sent its second reply has shared its keys."""
VICTIM = 2  # the partition whose SuperNode is killed (its index among the page's SuperNodes)


def test_a_supernode_killed_in_the_secure_round_leaves_the_merge_of_the_survivors(
    tmp_path_factory, tmp_path
):
    from flwr.common.config import parse_config_args

    from fedlmc.averaging import average
    from fedlmc.simulations.config import validate_run_config
    from fedlmc.strategies.secure import float_keys
    from tests.strategies.test_secure import clients_in_process

    out = tmp_path / "secure"
    run_config = (
        f'{TINY_MODEL} num-clients=3 min-clients=3 strategy="average" init="shared" '
        f'secure-aggregation="secagg+" calibration="none" inject-failure="hang:{VICTIM}" '
        f'out-dir="{out}"'
    )
    start = time.monotonic()
    started = start_deployment(tmp_path_factory, page_deployment(PAGE.read_text()))
    deployment = next(started)
    up = time.monotonic() - start
    run = None
    try:
        victim = deployment["processes"][1 + VICTIM]  # after the SuperLink
        log = deployment["logs"] / f"{1 + VICTIM}-flower-supernode.log"
        start = time.monotonic()
        args = [str(BIN / "flwr"), "run", ".", "loopback", "--run-config", run_config, "--stream"]
        run = subprocess.Popen(
            args,
            cwd=deployment["app"],
            env=deployment["env"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_for_replies(log, KEYS_SHARED, run, RUN_TIMEOUT)
        os.killpg(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic() - start
        victim.wait(timeout=15)
        output, _ = run.communicate(timeout=RUN_TIMEOUT)
        seconds = time.monotonic() - start
    finally:
        if run is not None and run.poll() is None:  # a failed wait: stop the flwr run we started
            run.kill()
            run.wait(timeout=15)
        started.close()
    print(f"\nsecure deployment: up in {up:.0f} s; flwr run: node killed at {killed_at:.0f} s,")
    print(f"ended at {seconds:.0f} s")
    assert run.returncode == 0 and (out / "results.csv").exists(), output[-4000:]
    rows = pd.read_csv(out / "results.csv")
    assert list(rows["method"]) == ["average"], output[-4000:]
    row = rows.iloc[0]
    # SecAgg+ unmasked without the dead node (2 of 3 >= the reconstruction threshold 2), and
    # named it by its node id, at the stage it missed, with the SuperLink's reason
    dead = node_id_of(log)
    assert row["clients_survived"] == 2 and row["clients_dropped"] == 1
    reason = row["clients_dropped_reasons"]
    assert reason.startswith(f"node {dead}: SecAgg+ stage 'masked vectors': "), reason
    assert "Node Unavailable" in reason and row["clients_failed"] == reason
    assert f"SecAgg+ merged without node {dead}" in output
    assert row["server_sees"] == "sum" and row["secure-aggregation"] == "secagg+"

    # the merged model is the clear weighted average of the two survivors (partitions 0 and 1,
    # retrained in process with the same seeds), within the quantisation bound
    config = validate_run_config(parse_config_args([run_config]))
    _, states, counts, _ = clients_in_process(config, 3, partitions=[0, 1])
    clear = average(states, counts)
    merged = load_file(str(out / "merged-average.safetensors"))
    bound = float(row["secagg_error_bound"]) + 1e-5  # + the retraining's float32 drift
    gaps = {k: float((merged[k] - clear[k]).abs().max()) for k in float_keys(clear)}
    assert max(gaps.values()) <= bound, gaps
    # ... and not the average of all three (partition 2's model would move it well past that)
    _, victim_state, victim_count, _ = clients_in_process(config, 3, partitions=[VICTIM])
    with_victim = average(states + victim_state, counts + victim_count)
    off = max(float((merged[k] - with_victim[k]).abs().max()) for k in gaps)
    print(f"largest difference from the survivors' clear average {max(gaps.values()):.2e}")
    print(f"(bound {row['secagg_error_bound']:.2e}); from all three's {off:.3f}")
    assert off > 10 * bound
    assert torch.isfinite(torch.cat([v.reshape(-1) for v in merged.values()])).all()
