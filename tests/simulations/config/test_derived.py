"""Values derived from a validated run config (:mod:`fedlmc.simulations.config.derived`): the
methods and rows of a cell, the clients' and server's widths, the resolved norm and bias."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.derived import (
    client_width,
    client_widths,
    explicit_server_width,
    method_list,
    mixed_widths,
    model_options,
    resolved_bias,
    resolved_norm,
    row_methods,
    selected_methods,
    server_width,
    uses_fedavg,
    widths_text,
)


def config(**values):
    return validate_run_config(
        {k.replace("_", "-"): v for k, v in values.items()}, check_devices=False
    )


def test_methods_are_listed_once_in_order():
    cell = config(methods="average, weight_matching,average,ensemble")
    assert method_list(cell) == ["average", "weight_matching", "ensemble"]
    assert row_methods(cell) == method_list(cell)
    assert selected_methods(cell) == ["average", "weight_matching"]  # the reference is no merge


def test_each_strategy_has_its_rows():
    assert row_methods(config(strategy="average")) == ["average", "average_t"]
    assert row_methods(config(strategy="average", calibration="none")) == ["average"]
    aligned = config(strategy="aligned", align="merge_many")
    assert row_methods(aligned) == ["merge_many", "merge_many_t"]
    assert selected_methods(aligned) == ["merge_many"]
    fedavg = config(strategy="fedavg", init="shared", epochs=5)
    assert row_methods(fedavg) == ["fedavg"] and selected_methods(fedavg) == []
    assert uses_fedavg(fedavg) and not uses_fedavg(config())
    assert uses_fedavg(config(methods="average,fedavg", init="shared", epochs=5))


def test_widths_resolve_per_partition_and_the_server_takes_the_widest():
    same = config(width=2.0, num_clients=3)
    assert client_widths(same) == (2.0, 2.0, 2.0) and server_width(same) == 2.0
    assert client_width(same, 7) == 2.0 and not mixed_widths(same)
    mixed = config(client_widths="0.5,1,2", num_clients=3, methods="embed_average")
    assert client_widths(mixed) == (0.5, 1.0, 2.0) and server_width(mixed) == 2.0
    assert mixed_widths(mixed) and widths_text(client_widths(mixed)) == "0.5,1,2"
    assert client_width(mixed, 1) == 1.0
    with pytest.raises(ValueError, match="partition-id = 3: .* partitions 0 .. 2 only"):
        client_width(mixed, 3)
    assert explicit_server_width(mixed) == 0.0  # the widest client's: the default's meaning
    wider = config(client_widths="0.5,1", server_width=4.0, methods="embed_average")
    assert explicit_server_width(wider) == 4.0 and server_width(wider) == 4.0


def test_auto_norm_and_bias_are_the_models_registered_defaults():
    mlp = config(model="mlp")
    assert resolved_norm(mlp) == "none"
    assert resolved_bias(mlp) == "true"
    assert resolved_bias(config(model="mlp", bias="false")) == "false"
    options = model_options(config(model="mlp", depth=2, bias="false"))
    assert options["depth"] == 2 and options["bias"] is False
