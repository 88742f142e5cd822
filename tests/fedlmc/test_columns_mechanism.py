"""fedlmc.columns_mechanism: the LEWC/LLFC, barrier and client-path column families are the
product of their declared keys, with the plain-chain note on exactly the LEWC columns."""

from __future__ import annotations

from fedlmc.columns_mechanism import (
    AT,
    BARRIER_AT,
    PLAIN_CHAINS,
    PREDICTION_KEYS,
    PREDICTION_MEAN_KEYS,
    barrier_family,
    client_barrier_family,
    layer_mechanism_family,
    lewc_scope_family,
    mechanism_family,
    prediction_layer_family,
    prediction_mean_family,
)


def test_a_layer_column_per_key_and_place_all_json():
    columns = prediction_layer_family()
    assert [c.name for c in columns] == [f"{k}_layers{at}" for at in AT for k in PREDICTION_KEYS]
    assert {c.kind for c in columns} == {"JSON"}


def test_a_mean_column_per_cosine_or_error_key_with_errors_in_the_lewc_table():
    assert set(PREDICTION_MEAN_KEYS) < set(PREDICTION_KEYS)
    assert (
        "norm_ratio" not in PREDICTION_MEAN_KEYS and "common_mode_share" not in PREDICTION_MEAN_KEYS
    )
    for column in prediction_mean_family():
        key = column.name.removesuffix("_quarter").removesuffix("_mean")
        assert key in PREDICTION_MEAN_KEYS
        assert column.report_table == ("LEWC" if "error" in key else "")
        assert f"`{key}_layers" in column.definition


def test_the_plain_chain_note_marks_exactly_the_lewc_prediction_columns():
    for column in (*prediction_layer_family(), *prediction_mean_family()):
        assert (PLAIN_CHAINS in column.applies) == column.name.startswith("lewc_"), column.name


def test_barriers_are_accuracy_loss_and_calibrated_loss_at_each_place():
    names = [c.name for c in barrier_family()]
    assert len(set(names)) == len(names) == 3 * len(BARRIER_AT)
    for at in BARRIER_AT:
        assert {
            f"accuracy_barrier_{at}",
            f"loss_barrier_{at}",
            f"loss_barrier_{at}_calibrated",
        } <= set(names)
    assert {c.report_table for c in barrier_family()} == {"barriers"}


def test_client_paths_come_as_mean_and_worst_pairs():
    names = [c.name for c in client_barrier_family()]
    means = [n for n in names if n.endswith("_mean")]
    assert sorted(names) == sorted([*means, *(m.removesuffix("_mean") + "_worst" for m in means)])
    assert all(n.startswith("client_to_merge_path_") for n in names)


def test_all_families_together_declare_no_name_twice():
    families = (
        prediction_layer_family,
        prediction_mean_family,
        barrier_family,
        client_barrier_family,
        mechanism_family,
        layer_mechanism_family,
        lewc_scope_family,
    )
    names = [c.name for f in families for c in f()]
    assert len(names) == len(set(names))
    assert {c.kind for c in lewc_scope_family()} == {"text"}
