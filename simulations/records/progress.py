"""What one federation's ServerApp tells its user while it runs, and where its rows went.

:class:`RunProgress` turns the server's stages into one-line messages with the elapsed time
(``[  12 s] 3 clients trained``): waiting for the clients to train, the clients trained, each
base merge of the ``compare`` strategy numbered with an estimate of the time left (from the
mean time of the merges so far), the evaluation done. Its ``say`` is where the lines go: the
Flower log for ``flwr run`` (:func:`flower_say`), stderr for ``fedlmc run`` (:func:`stderr_say`);
a sweep passes none (its own progress bar counts cells).

:func:`rows_destination` is the sentence on where a run's rows went: ``out-dir``'s files, or
that nothing was written to disk (the ServerApp logs it, ``fedlmc run`` prints it).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from logging import INFO
from pathlib import Path
from typing import Any

Say = Callable[[str], None]

__all__ = ["RunProgress", "Say", "flower_say", "rows_destination", "stderr_say"]


def flower_say(message: str) -> None:
    """One line in Flower's log (INFO): what ``flwr run . --stream`` shows."""
    from flwr.supercore import log

    log(INFO, "fedlmc: %s", message)


def stderr_say(message: str) -> None:
    """One line on stderr (``fedlmc run``: the table of rows stays alone on stdout)."""
    print(f"fedlmc run: {message}", file=sys.stderr, flush=True)


class RunProgress:
    """The stages of one federation as timed one-line messages (module docstring)."""

    def __init__(self, say: Say | None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.say = say
        self.clock = clock
        self.start = clock()
        self.merges: list[str] = []
        self.total = 0
        self.first_merge = 0.0

    def __call__(self, message: str) -> None:
        if self.say is not None:
            self.say(f"[{self.clock() - self.start:5.0f} s] {message}")

    def training(self, clients: int, epochs: int) -> None:
        """Before the training round."""
        self(f"waiting for {clients} clients to train ({epochs} epoch(s) each)")

    def trained(self, survivors: int, seconds: float) -> None:
        """After the training round."""
        self(f"{survivors} client model(s) received after {seconds:.0f} s of training")

    def merging(self, bases: Sequence[str]) -> Say:
        """The ``progress`` callback for :func:`fedlmc.study.compare_methods` over the base
        merges ``bases``: each ``merging: m`` message numbered ``k/M`` with the time left
        estimated as the mean time per merge so far times the merges left."""
        self.total, self.merges = len(bases), []

        def on_message(message: str) -> None:
            if not message.startswith("merging: "):
                return
            now = self.clock()
            if not self.merges:
                self.first_merge = now
            done = len(self.merges)
            self.merges.append(message.removeprefix("merging: "))
            left = ""
            estimate = (now - self.first_merge) / done * (self.total - done) if done else 0.0
            if estimate >= 1:  # an estimate only once a merge took measurable time
                left = f", about {estimate:.0f} s left"
            self(f"merge and evaluation {done + 1}/{self.total}: {self.merges[-1]}{left}")

        return on_message

    def finished(self, rows: int) -> None:
        """After every row is computed."""
        self(f"evaluation done: {rows} row(s)")


def rows_destination(config: Mapping[str, Any]) -> str:
    """Where the run's rows went: ``out-dir``'s ``results.csv`` (with ``training.csv`` and the
    merged weights), or that the run wrote nothing to disk and how to keep the rows."""
    if not config["out-dir"]:
        return (
            "out-dir is empty: the rows were not written to disk (set out-dir=DIR to keep "
            "results.csv, training.csv and merged-<method>.safetensors)"
        )
    folder = Path(config["out-dir"])
    return (
        f"rows written to {folder / 'results.csv'} (with training.csv and "
        f"merged-<method>.safetensors in {folder})"
    )
