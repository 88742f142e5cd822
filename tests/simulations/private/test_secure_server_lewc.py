"""``calibration = "lewc"`` under ``secure-aggregation = "secagg+"`` through the ServerApp in
process (the real ServerApp and ClientApp with Flower's SecAgg+ on a Grid that hands each
message to the ClientApp): the server, which sees only the masked sum, predicts the ``_t`` row's
temperature from the template's depth and the public example counts (no temperature round),
and applies it to the merged model's logits."""

from __future__ import annotations

import pytest

from fedlmc.averaging import load_state
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.server_app import run_server
from fedlmc.simulations.task import build_from_config, load_splits
from tests.simulations.private.test_secure_server_statistics import SecureGrid
from tests.simulations.test_client_app_warmup import TINY

CELL = {**TINY, "num-clients": 3, "epochs": 1, "init": "independent", "strategy": "average"}
CELL |= {"calibration": "lewc", "secure-aggregation": "secagg+"}


def test_a_secure_cell_predicts_its_temperature_from_the_public_counts(task_identity):
    config = validate_run_config(CELL)
    outcome = run_server(SecureGrid(3), config, simulated=True)
    counts = outcome.secure["average"].num_examples
    expected = sum((n / sum(counts)) ** 3 for n in counts)  # depth 2: 3 weight layers
    rows = outcome.table().set_index("method")
    assert list(rows.index) == ["average", "average_t"]
    assert rows.loc["average_t", "temperature"] == pytest.approx(expected)
    assert (rows["rounds"] == 4).all()  # SecAgg+'s four rounds: no temperature round
    splits = load_splits(config)
    model = load_state(build_from_config(config, splits), outcome.merged["average"]).eval()
    at_t = metrics_from_logits(predict_logits(model, splits.test[0]), splits.test[1], expected)
    assert rows.loc["average_t", "nll"] == pytest.approx(at_t["nll"], abs=1e-6)
    assert rows.loc["average_t", "nll"] != pytest.approx(rows.loc["average", "nll"], abs=1e-3)
