"""The training-curve table: every column of ``training.csv`` declared once.

``training.csv`` (next to ``results.csv``, written by a sweep and by ``fedlmc run`` / the
ServerApp) is tidy: one row per cell x client x local epoch of the clients' own training
(phase :data:`CLIENT_EPOCH`), plus one row per cell x FedAvg round (phase :data:`FEDAVG_ROUND`).
Its columns, in order:

1. ``cell_id`` (a sweep's file only; 12 hex digits, as in ``results.csv``);
2. the cell's run-config columns, named and ordered exactly as in ``results.csv`` (hyphenated
   keys; a sweep's file leaves out the cell's output folder, as its ``results.csv`` does);
3. :data:`TRAINING_COLUMNS`: ``phase``, ``client``, ``step``, then the float metric columns
   (empty = NaN: the column does not apply to the row's phase, or the value was not measured).

A :class:`TrainingColumn` holds a column's name, its kind (``text``, ``integer`` or ``number``),
the phase it applies to and its definition. The docs' table (``docs/reference/columns.md``,
:func:`training_columns_markdown`), the writer and the reader all derive from
:data:`TRAINING_COLUMNS`. Imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CLIENT_EPOCH",
    "FEDAVG_ROUND",
    "KEY_COLUMNS",
    "METRIC_COLUMNS",
    "PHASES",
    "TRAINING_COLUMNS",
    "TRAINING_FILE",
    "TrainingColumn",
    "training_columns_markdown",
]

TRAINING_FILE = "training.csv"
CLIENT_EPOCH = "client_epoch"
"""Phase of a client's own training (the one-shot round every merge uses): one row per epoch."""
FEDAVG_ROUND = "fedavg_round"
"""Phase of the FedAvg baseline: one row per round."""
PHASES = (CLIENT_EPOCH, FEDAVG_ROUND)


@dataclass(frozen=True)
class TrainingColumn:
    """One column of ``training.csv`` after the run-config columns."""

    name: str
    kind: str
    """``text``, ``integer`` (empty where it does not apply) or ``number`` (a float; NaN)."""
    applies: str
    """The phase(s) whose rows hold a value."""
    definition: str

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"column name {self.name!r}: allowed: a Python identifier")
        if self.kind not in ("text", "integer", "number"):
            raise ValueError(f"column {self.name!r}: kind = {self.kind!r}")


_BOTH = f"`{CLIENT_EPOCH}`, `{FEDAVG_ROUND}`"
_CLIENT = f"`{CLIENT_EPOCH}`"
_FEDAVG = f"`{FEDAVG_ROUND}`"

TRAINING_COLUMNS: tuple[TrainingColumn, ...] = (
    TrainingColumn(
        "phase",
        "text",
        _BOTH,
        f"`{CLIENT_EPOCH}`: a client's own training (the independent or shared initialisation of "
        f"the run's one-shot round; the models every merge of the cell uses); `{FEDAVG_ROUND}`: "
        "one round of the FedAvg baseline",
    ),
    TrainingColumn(
        "client",
        "integer",
        _CLIENT,
        "The client's partition id (0-based, as in `clients_failed`); empty on "
        f"`{FEDAVG_ROUND}` rows",
    ),
    TrainingColumn(
        "step",
        "integer",
        _BOTH,
        f"1-based: the local epoch on `{CLIENT_EPOCH}` rows, the FedAvg round on "
        f"`{FEDAVG_ROUND}` rows",
    ),
    TrainingColumn(
        "train_loss",
        "number",
        _CLIENT,
        "The client's mean cross-entropy over the epoch's (augmented) training batches, each "
        "batch's loss taken before its own optimiser step (so it lags the end-of-epoch model)",
    ),
    TrainingColumn(
        "train_accuracy",
        "number",
        _CLIENT,
        "The client's accuracy over the same training batches, as the model stood at each batch",
    ),
    TrainingColumn(
        "calibration_loss",
        "number",
        _CLIENT,
        "Mean cross-entropy (T = 1) of the client's model at the end of the epoch on its "
        "held-out calibration share (eval mode, no augmentation); NaN when the client holds none "
        "out (calibration not federated, or a holdout share of 0: no held-out data exists)",
    ),
    TrainingColumn(
        "merged_test_loss",
        "number",
        _FEDAVG,
        "Mean test-split cross-entropy (T = 1) of FedAvg's global model after the round; the "
        "last round's equals the `fedavg` row's raw NLL in results.csv",
    ),
    TrainingColumn(
        "merged_test_accuracy",
        "number",
        _FEDAVG,
        "Test-split accuracy of FedAvg's global model after the round; the last round's equals "
        "the `fedavg` row's `accuracy`",
    ),
    TrainingColumn(
        "clients_train_loss",
        "number",
        _FEDAVG,
        "Mean over the round's surviving clients of their last local epoch's `train_loss`, "
        "weighted by their merge weights (num-examples shares, bounded as in "
        "`fedlmc.strategies.screening`)",
    ),
    TrainingColumn(
        "clients_train_accuracy",
        "number",
        _FEDAVG,
        "Mean over the round's surviving clients of their last local epoch's `train_accuracy`, "
        "weighted by their merge weights",
    ),
)
"""The columns after the run-config columns, in file order."""

KEY_COLUMNS = tuple(c.name for c in TRAINING_COLUMNS if c.kind != "number")
"""``phase``, ``client``, ``step``: with the cell, what identifies a row."""
METRIC_COLUMNS = tuple(c.name for c in TRAINING_COLUMNS if c.kind == "number")
"""The float metric columns, in file order."""


def training_columns_markdown() -> str:
    """The docs' table of :data:`TRAINING_COLUMNS` (after ``cell_id`` and the config columns)."""
    lines = ["| column | kind | phase | definition |", "|---|---|---|---|"]
    for column in TRAINING_COLUMNS:
        text = column.definition.replace("|", "/")
        lines.append(f"| `{column.name}` | {column.kind} | {column.applies} | {text} |")
    return "\n".join(lines)
