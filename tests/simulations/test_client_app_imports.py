"""What a ClientApp process imports: on a SuperNode every message is answered by a fresh
``flwr-clientapp`` process that loads the app, so the app module loads Flower and fedlmc's
configuration only, and each handler imports what its message needs. A SecAgg+ key exchange
(the setup stage, answered by Flower's ``secaggplus_mod`` on the ``train`` handler) is answered
without torch, SciPy or numba."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.supercore.task_identity import TaskIdentity

HEAVY = ("torch", "scipy", "numba", "pandas")
from fedlmc.simulations.client_app import app
print("loaded", [m for m in HEAVY if m in sys.modules])
TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
setup = {
    Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: 3, Key.SHARE_NUMBER: 3, Key.THRESHOLD: 2,
    Key.CLIPPING_RANGE: 8.0, Key.TARGET_RANGE: 1 << 22, Key.MOD_RANGE: 1 << 32,
    Key.MAX_WEIGHT: 1000.0,
}
message = Message(
    RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(setup)}), dst_node_id=101, message_type="train"
)
context = Context(
    run_id=7, node_id=101, state=RecordDict(), run_config={},
    node_config={"partition-id": 0, "num-partitions": 3},
)
reply = app(message, context)
print("error", reply.has_error())
print("keys", sorted(reply.content.config_records[RECORD_KEY_CONFIGS]))
print("answered", [m for m in HEAVY if m in sys.modules])
"""


@pytest.mark.slow
def test_the_app_loads_and_answers_a_secagg_key_exchange_without_torch():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines == ["loaded []", "error False", "keys ['pk1', 'pk2']", "answered []"], out.stdout
