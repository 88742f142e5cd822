"""The settings every fedlmc strategy takes, as one frozen, validated object.

``ScreenedFedAvg``, ``OneShotAverage`` (and its subclasses ``PermutationAlignedAverage``,
``AutoMerge``) and ``FedAvgBaseline`` take a :class:`StrategyOptions`: how many clients to wait
for and accept, how replies are screened and weighted, and, for the one-shot strategies, where
the merge is calibrated and on which device. Build it once, share it between strategies (a
FedAvg warm-up and the one-shot merge after it), derive a variant with ``options.replace(...)``.
The options object is the strategies' only way to receive these settings (no keyword argument
of a field's name).

Every field is checked when the object is built (``StrategyOptions.__post_init__``), before
any client trains; the one check that depends on the strategy (``calibration = "server"`` needs
``server_data``) is the one-shot strategies'.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedlmc.merging.calibrate import temperature_grid
from fedlmc.merging.post_merge import CALIBRATIONS
from fedlmc.strategies.protocol import HOLDOUT_SHARE_KEY, NUM_EXAMPLES_KEY, holdout_share
from fedlmc.strategies.robust import CLIENT_CHECKS, RobustScreen
from fedlmc.strategies.screening import ClientReferences, WeightBound
from fedlmc.strategies.strategy_utils import check_choice, check_client_counts

Data = tuple[Tensor, Tensor]

__all__ = ["DEFAULT_HOLDOUT_SHARE", "StrategyOptions"]

DEFAULT_HOLDOUT_SHARE = 0.1
"""The share each client holds out under ``calibration = "federated"`` unless told otherwise
(the run config's ``calibration-holdout`` default)."""


@dataclass(frozen=True)
class StrategyOptions:
    """What a fedlmc strategy is configured with (see the module docstring).

    :param num_clients: Nodes to wait for before sending the round (``wait_timeout`` seconds at
        most).
    :param min_clients: Fewest surviving replies a round accepts (``NotEnoughClientsError``
        otherwise).
    :param wait_timeout: Seconds to wait for ``num_clients`` nodes (``NodesUnavailableError``
        after).
    :param weighted_by_key: The reply metric the average is weighted by (``num-examples``).
    :param arrayrecord_key: The names of the arrays and the config in the messages (Flower's
        ``FedAvg``'s).
    :param configrecord_key: The names of the arrays and the config in the messages (Flower's
        ``FedAvg``'s).
    :param weight_bound: The bound on a client's merge weight (default ``WeightBound()``,
        :class:`fedlmc.strategies.screening.WeightBound`).
    :param client_references: Clients of different widths: the arrays expected of each partition (a
        reply of other shapes is dropped by name); the merge method must then be a mixed-width one.
    :param robust: The robust screen of the replies against each other (default factor 10).
    :param client_check: The check of each client's model before the merge
        (:mod:`fedlmc.strategies.robust`, :data:`~fedlmc.strategies.robust.CLIENT_CHECKS`):
        ``"server-split"`` (copies of another client's model, and, with ``server_data`` in a
        one-shot strategy and 3 or more clients, an accuracy on it below chance and far below
        the others'), ``"copies"`` or ``"off"``.
    :param calibration: One-shot strategies: where BatchNorm statistics, REPAIR statistics and the
        temperature are fitted (the server's held-out data, the clients' data through query rounds,
        or not at all); ``"lewc"``: no fit, ``T = sum_i w_i^L`` predicted from the chain's
        depth and the merge weights (:mod:`fedlmc.merging.lewc_temperature`; the plain average of
        norm-free chains only, refused at construction elsewhere).
    :param server_data: One-shot strategies: the server's held-out data; required for
        ``calibration="server"``.
    :param query_timeout: One-shot strategies: seconds a query round waits for replies (``None``:
        Flower's default).
    :param keep_client_states: One-shot strategies: keep the survivors' state dicts in the result's
        ``report``.
    :param temperature_steps: One-shot strategies: the federated temperature fit's Newton steps and
        grid.
    :param temperature_grid_points: One-shot strategies: the federated temperature fit's Newton
        steps and grid.
    :param holdout_share: The share of its partition each client holds out from training (for the
        federated temperature fit), sent as ``holdout-share`` in the train message and the queries
        after it (:mod:`fedlmc.strategies.protocol`); ``None``:
        :data:`DEFAULT_HOLDOUT_SHARE` under ``calibration = "federated"``, else 0 (nothing sent).
        0 with federated calibration calibrates in-sample on the training data.
    :param clients_keep_models: The clients keep their trained weights after the train round,
        for a study whose several methods query them (``keep-model = "several-queries"``); a
        merge method of the strategy that queries the clients asks for it itself (``one-query``).
    :param device: One-shot strategies: where the server merges and evaluates (default: CPU, or CUDA
        when ``"cuda"``/``"auto"``).
    """

    num_clients: int
    min_clients: int = 2
    wait_timeout: float = 600.0
    weighted_by_key: str = NUM_EXAMPLES_KEY
    arrayrecord_key: str = "arrays"
    configrecord_key: str = "config"
    weight_bound: WeightBound | None = None
    client_references: ClientReferences | None = None
    robust: RobustScreen | None = None
    client_check: str = "server-split"
    calibration: str = "server"
    server_data: Data | None = None
    query_timeout: float | None = 600.0
    keep_client_states: bool = False
    temperature_steps: int = 8
    temperature_grid_points: int = 1001
    holdout_share: float | None = None
    clients_keep_models: bool = False
    device: str | torch.device | None = None

    def __post_init__(self) -> None:
        """Every field checked, with the bad value and what is allowed named."""
        check_client_counts(self.num_clients, self.min_clients)
        check_choice("calibration", self.calibration, CALIBRATIONS)
        check_choice("client_check", self.client_check, CLIENT_CHECKS)
        _check_positive("wait_timeout", self.wait_timeout)
        if self.query_timeout is not None:
            _check_positive("query_timeout", self.query_timeout)
        if int(self.temperature_steps) != self.temperature_steps or self.temperature_steps < 1:
            raise ValueError(
                f"temperature_steps = {self.temperature_steps!r}; allowed: an integer >= 1"
            )
        temperature_grid(int(self.temperature_grid_points))  # ValueError naming the bad value
        if self.holdout_share is not None:
            holdout_share({HOLDOUT_SHARE_KEY: self.holdout_share})  # ValueError naming it
        for name, kind in (
            ("weight_bound", WeightBound),
            ("client_references", ClientReferences),
            ("robust", RobustScreen),
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise ValueError(f"{name} = {value!r}; allowed: a {kind.__name__} or None")

    @property
    def client_holdout(self) -> float:
        """The share each client holds out (``holdout_share`` resolved: see its parameter)."""
        if self.holdout_share is not None:
            return float(self.holdout_share)
        return DEFAULT_HOLDOUT_SHARE if self.calibration == "federated" else 0.0

    def replace(self, **changes: Any) -> StrategyOptions:
        """A copy with ``changes`` (field names; checked like a new object; ``TypeError`` naming
        a name that is no field)."""
        return dataclasses.replace(self, **changes)


def _check_positive(name: str, value: Any) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} = {value!r}; allowed: a number of seconds > 0")
