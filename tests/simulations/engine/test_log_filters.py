"""Flower's console output during a sweep (:mod:`fedlmc.simulations.engine.log_filters`): the
deprecation notice and the shutdown traceback of a client actor whose owner is exiting are
hidden, every other error of Flower's still shows. In process, on Flower's own logger."""

from __future__ import annotations

import logging

import pytest

from fedlmc.simulations.engine.log_filters import quiet_flower

OWNER_EXIT = (
    "Traceback (most recent call last):\n  ...\nray.exceptions.ActorDiedError: The actor died "
    "unexpectedly before finishing this task.\n\tclass_name: ClientAppActor\nThe actor is dead "
    "because its owner has died. Owner worker exit type: INTENDED_USER_EXIT"
)


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def flower_log():
    logger = logging.getLogger("flwr")
    handler = Collect()
    logger.addHandler(handler)
    yield logger, handler.messages
    logger.removeHandler(handler)


@pytest.mark.parametrize("verbose", [False, True])
def test_the_owner_exit_traceback_is_hidden_and_other_errors_show(flower_log, verbose):
    logger, seen = flower_log
    with quiet_flower(verbose):
        logger.error(OWNER_EXIT)
        logger.error("ray.exceptions.ActorDiedError: the actor died (a client crashed)")
        logger.error("client 3 raised ValueError")
    assert seen == [
        "ray.exceptions.ActorDiedError: the actor died (a client crashed)",
        "client 3 raised ValueError",
    ]


def test_the_deprecation_notice_is_hidden_unless_verbose_and_the_filters_are_removed(
    flower_log,
):
    logger, seen = flower_log
    with quiet_flower(verbose=False):
        logger.warning("DEPRECATED FEATURE: run_simulation")
    with quiet_flower(verbose=True):
        logger.warning("DEPRECATED FEATURE: run_simulation")
    logger.error(OWNER_EXIT)  # outside a sweep nothing is hidden
    assert seen == ["DEPRECATED FEATURE: run_simulation", OWNER_EXIT]


def worker_record(message: str, module: str) -> logging.LogRecord:
    """A record as Flower's simulation worker (``vce_api``) or Ray backend logs it."""
    record = logging.LogRecord("flwr", logging.ERROR, f"{module}.py", 1, message, None, None)
    record.module = module
    return record


def test_once_stopping_the_message_workers_errors_are_hidden(flower_log, monkeypatch):
    """SIGTERM to the process group reaches the client actors too: Flower's worker then logs
    each dead actor (its error, then its traceback). Once the process is stopping they are
    noise; before, and from any other module, an error still shows."""
    from fedlmc.simulations.engine import log_filters

    logger, seen = flower_log
    unavailable = "The actor is unavailable: UnexpectedSystemExit: ... receives a SIGTERM"
    with quiet_flower(verbose=False):
        logger.handle(worker_record(unavailable, "vce_api"))  # not stopping: a client failure
        monkeypatch.setattr(log_filters, "stopping", lambda: True)
        logger.handle(worker_record(unavailable, "vce_api"))
        logger.handle(worker_record("An exception was raised ... by RayBackend", "raybackend"))
        logger.handle(worker_record("Traceback (most recent call last): ...", "vce_api"))
        logger.handle(worker_record("the strategy dropped client 2", "one_shot"))
    assert seen == [unavailable, "the strategy dropped client 2"]


def test_once_stopping_rays_deserializer_traceback_is_hidden(monkeypatch):
    """A client actor killed by the SIGTERM sent to the process group: Ray's deserializer fails
    an assertion reading its death and logs the traceback (seen in CI after ``kill -TERM``).
    Hidden once stopping, during the sweep and after it (Ray's threads outlive the sweep while
    the process exits); before, the same error shows."""
    from fedlmc.simulations.engine import log_filters

    logger = logging.getLogger("ray._private.serialization")
    handler = Collect()
    logger.addHandler(handler)
    failure = "Traceback (most recent call last): ... assert ray_error_info.HasField(...)"
    try:
        with quiet_flower(verbose=False):
            logger.error(failure)  # not stopping: shown
            monkeypatch.setattr(log_filters, "stopping", lambda: True)
            logger.error(failure)
        logger.error("after the sweep, stopping")
        monkeypatch.setattr(log_filters, "stopping", lambda: False)
        logger.error("after the sweep")
    finally:
        logger.removeHandler(handler)
    assert handler.messages == [failure, "after the sweep"]
