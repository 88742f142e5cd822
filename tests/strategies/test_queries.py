"""ClientRounds (fedlmc.strategies.queries) is every query a merge method and the post-merge
pipeline send to the clients: the methods of ClientQueries and of StatisticsSource, from the
classes of what each round asks, on one round's state."""

from __future__ import annotations

import inspect

from fedlmc.merging.merge_job import ClientQueries
from fedlmc.merging.post_merge import StatisticsSource
from fedlmc.strategies.moment_rounds import MomentRounds
from fedlmc.strategies.own_model_rounds import OwnModelRounds
from fedlmc.strategies.queries import ClientRounds
from fedlmc.strategies.query_round import QueryRound
from fedlmc.strategies.temperature_rounds import TemperatureRounds


def _methods(protocol) -> set[str]:
    return {
        name
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


def test_client_rounds_answers_every_query_of_the_merge_and_the_post_merge_pipeline():
    wanted = _methods(ClientQueries) | _methods(StatisticsSource)
    assert {"calibrated_nlls", "fisher_diagonals", "temperature", "refuse"} <= wanted
    assert all(callable(getattr(ClientRounds, name, None)) for name in wanted)
    assert ClientRounds.name == "federated"


def test_each_kind_of_question_is_its_own_class_on_one_round():
    assert ClientRounds.__mro__[1:5] == (
        TemperatureRounds,
        MomentRounds,
        OwnModelRounds,
        QueryRound,
    )
    assert ClientRounds.__init__ is QueryRound.__init__
    assert "bn_statistics" in vars(MomentRounds) and "grid_minima" in vars(TemperatureRounds)
    assert "gram_matrices" in vars(OwnModelRounds) and "ask" in vars(QueryRound)
