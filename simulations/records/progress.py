r"""What one federation's ServerApp tells its user while it runs, and where its rows went.

:class:`RunProgress` turns the server's stages into one-line messages with the elapsed time
(``[  12 s] 3 clients trained``): waiting for the clients to train, the clients trained, each
base merge of the ``compare`` strategy numbered with an estimate of the time left (from the
mean time of the merges so far), the evaluation done. Its ``say`` is where the lines go: the
Flower log for ``flwr run`` (:func:`flower_say`), stderr for ``fedlmc run`` (:func:`stderr_say`);
a sweep passes none (its own progress bar counts cells and redraws every second,
:func:`redrawn`).

While the clients train, nothing else happens on the server, so the wait itself is told
(:meth:`RunProgress.round`, fed by :class:`fedlmc.simulations.records.watched_grid.WatchedGrid`
with each reply as it arrives): a client's training reply as a line with the replies so far
and the time left at the rate so far (:math:`t \cdot (N - k) / k` after :math:`k` of :math:`N`
replies in :math:`t` seconds), and a line every :data:`HEARTBEAT_SECONDS` without news, so that
a log (``flwr run``, a deployment, ``fedlmc run`` into a file) is never silent for a minute; on
a terminal ``fedlmc run`` draws one bar instead, redrawn every :data:`REDRAW_SECONDS` with the
elapsed time and the time left. Rounds of other messages (queries, SecAgg+'s stages) get the
heartbeat only.

:func:`rows_destination` is the sentence on where a run's rows went: ``out-dir``'s files, or
that nothing was written to disk (the ServerApp logs it, ``fedlmc run`` prints it).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from logging import INFO
from pathlib import Path
from typing import Any

Say = Callable[[str], None]

__all__ = [
    "RoundWatch",
    "RunProgress",
    "Say",
    "flower_say",
    "redrawn",
    "rows_destination",
    "stderr_say",
]

HEARTBEAT_SECONDS = 30.0
"""Longest a log goes without a line while the server waits for replies."""
REDRAW_SECONDS = 1.0
"""How often a progress bar on a terminal is redrawn (its elapsed time and time left)."""
REPLY_LINE_SECONDS = 5.0
"""Least time between two reply lines (the first and the last reply are always told)."""


def flower_say(message: str) -> None:
    """One line in Flower's log (INFO): what ``flwr run . --stream`` shows."""
    from flwr.supercore import log

    log(INFO, "fedlmc: %s", message)


SHORT_CONFIG_CHARACTERS = 240
"""Longest ``ConfigRecord`` text Flower's strategy log keeps whole (:class:`ShortConfigLog`)."""
CONFIG_LINE = "\t├── ConfigRecord ("
FINAL_RESULTS = "Final results:"
FLOWER_SUMMARY = (
    "Final results (Flower's round summary: the strategy's rounds as Flower records them, "
    "at temperature 1.0, not fedlmc's results; those are the 'fedlmc result:' and "
    "'fedlmc clients:' lines at the end):"
)


class ShortConfigLog(logging.Filter):
    """Flower's strategy start logs the train ``ConfigRecord`` on one line: fedlmc's carries
    every run-config key (50 and more). This filter cuts such a line to its first keys and
    says how many there are and where all of them are listed; and it says of the "Final
    results:" block the strategy's start logs that it is Flower's round summary
    (:data:`FLOWER_SUMMARY`), not the rows fedlmc computes after it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message, args = record.msg, record.args
        if message == FINAL_RESULTS:
            record.msg = FLOWER_SUMMARY
        if isinstance(message, str) and message.startswith(CONFIG_LINE) and args:
            text = str(args[0] if isinstance(args, tuple) else args)
            if len(text) > SHORT_CONFIG_CHARACTERS:
                record.args = (short_config_text(text),)
        return True


def short_config_text(text: str) -> str:
    """``{'a': 1, 'b': 2, ...}`` cut after whole items to :data:`SHORT_CONFIG_CHARACTERS`,
    with the number of keys (:class:`ShortConfigLog`)."""
    keys = text.count("': ") or 1
    cut = text.rfind(", '", 0, SHORT_CONFIG_CHARACTERS)
    kept = text[: cut if cut > 0 else SHORT_CONFIG_CHARACTERS]
    return f"{kept}, ...}} ({keys} keys: the run config; `fedlmc keys` lists every key)"


def shorten_flower_config_logs() -> None:
    """Add :class:`ShortConfigLog` to Flower's logger once (the ServerApp of ``flwr run``)."""
    logger = logging.getLogger("flwr")
    if not any(isinstance(f, ShortConfigLog) for f in logger.filters):
        logger.addFilter(ShortConfigLog())


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

    def training(self, clients: int, epochs: int, secure: bool = False) -> None:
        """Before the training round (``secure``: the models come back masked by SecAgg+)."""
        how = ", then send their models masked by SecAgg+" if secure else ""
        self(f"waiting for {clients} clients to train ({epochs} epoch(s) each){how}")

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

    @property
    def watching(self) -> bool:
        """Whether the server's waits are told (a ``say`` is set: not in a sweep's cells)."""
        return self.say is not None

    def round(self, what: str, total: int, per_reply: bool) -> RoundWatch:
        """A :class:`RoundWatch` of one message round of ``total`` messages (module docstring;
        ``per_reply``: a training round, each reply told); a bar on a terminal for ``fedlmc
        run``'s training rounds."""
        bar = self.say is stderr_say and per_reply and sys.stderr.isatty()
        return RoundWatch(self, what, total, per_reply=per_reply, bar=bar)


class RoundWatch:
    """The replies to one round of ``total`` messages of one type, told as they arrive and on
    a timer until :meth:`close` (module docstring). Thread-safe: replies may be heard on
    another thread (the sweep engine's broker)."""

    def __init__(
        self,
        progress: RunProgress,
        what: str,
        total: int,
        *,
        per_reply: bool = True,
        bar: bool = False,
        heartbeat: float = HEARTBEAT_SECONDS,
    ) -> None:
        self.progress, self.total, self.heartbeat = progress, int(total), heartbeat
        self.training, self.what = per_reply, what
        self.replies = 0
        self.start = self.last_told = progress.clock()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._bar = _reply_bar(total) if bar else None
        period = REDRAW_SECONDS if bar else min(heartbeat, REDRAW_SECONDS * 5)
        self._timer = threading.Thread(target=self._tick, args=(period,), daemon=True)
        self._timer.start()

    def status(self) -> str:
        """``training: 1/3 client(s) replied after 40 s, about 80 s left at the rate so far``."""
        elapsed = self.progress.clock() - self.start
        text = f"{self.what}: {self.replies}/{self.total} client(s) replied after {elapsed:.0f} s"
        left = elapsed * (self.total - self.replies) / max(self.replies, 1)
        if 0 < self.replies < self.total and left >= 1:
            text += f", about {left:.0f} s left at the rate so far"
        return text

    def replied(self, count: int = 1) -> None:
        """``count`` more replies arrived (a line for each training reply)."""
        with self._lock:
            first = self.replies == 0
            self.replies += int(count)
            if self._bar is not None:
                self._bar.update(int(count))
            elif self.training and (first or self._worth_a_line()):
                self._tell()

    def close(self) -> None:
        """The round is over: stop the timer, close the bar."""
        self._done.set()
        self._timer.join(timeout=5)
        if self._bar is not None:
            self._bar.close()

    def _worth_a_line(self) -> bool:
        """The last reply, and any other :data:`REPLY_LINE_SECONDS` after the last line (64
        clients that finish together make 2 or 3 lines, not 64; the first is always told)."""
        last = self.replies >= self.total
        return last or self.progress.clock() - self.last_told >= REPLY_LINE_SECONDS

    def _tell(self) -> None:
        self.last_told = self.progress.clock()
        self.progress(self.status())

    def _tick(self, period: float) -> None:
        while not self._done.wait(period):
            with self._lock:
                if self._bar is not None:
                    self._bar.refresh()
                elif self.progress.clock() - self.last_told >= self.heartbeat:
                    self._tell()


def _reply_bar(total: int) -> Any:
    """A tqdm bar on stderr over ``total`` client replies, with elapsed time and time left."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc="fedlmc run: training",
        unit="client",
        file=sys.stderr,
        leave=False,
        bar_format="{desc}: {n}/{total} client(s) replied |{bar}| {elapsed} elapsed, "
        "{remaining} left",
    )


class LinePerUpdate:
    """A file for a tqdm bar that is not on a terminal: each frame tqdm draws (``\\r`` + the
    bar) becomes one plain line, without the carriage returns and cursor codes that make a log
    file unreadable; empty frames (tqdm clearing its line) are dropped."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        for frame in ANSI_CODE.sub("", text).replace("\r", "\n").split("\n"):
            if frame.strip():
                self.stream.write(frame.rstrip() + "\n")

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


ANSI_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
"""A terminal control sequence (colour, cursor movement)."""


def bar_file(stream: Any = None) -> Any:
    """Where a tqdm bar writes: ``stream`` (default ``sys.stderr``) itself on a terminal, else
    a :class:`LinePerUpdate` over it (one line per update into a file or a pipe)."""
    stream = sys.stderr if stream is None else stream
    return stream if getattr(stream, "isatty", lambda: False)() else LinePerUpdate(stream)


@contextmanager
def redrawn(bar: Any, seconds: float | None = None) -> Iterator[Any]:
    """``bar`` (a tqdm bar) redrawn while the block runs, so that its elapsed time and time
    left move between events: every :data:`REDRAW_SECONDS` on a terminal, every
    :data:`HEARTBEAT_SECONDS` into a file (a log keeps a line per redraw), or every ``seconds``;
    a disabled bar is left alone."""
    if seconds is None:
        terminal = getattr(getattr(bar, "fp", None), "isatty", lambda: False)()
        seconds = REDRAW_SECONDS if terminal else HEARTBEAT_SECONDS
    done = threading.Event()

    def redraw() -> None:
        while not done.wait(seconds):
            bar.refresh()

    thread = (
        None if getattr(bar, "disable", False) else threading.Thread(target=redraw, daemon=True)
    )
    if thread is not None:
        thread.start()
    try:
        yield bar
    finally:
        done.set()
        if thread is not None:
            thread.join(timeout=5)


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
