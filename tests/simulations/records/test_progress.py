"""What a run tells while its clients train: a line per training reply with the time left at
the rate so far, a heartbeat line when nothing arrives, a bar that redraws on a timer."""

from __future__ import annotations

import io
import time

from fedlmc.simulations.records.progress import RoundWatch, RunProgress, redrawn


def test_each_training_reply_is_told_with_the_time_left_at_the_rate_so_far():
    now = [0.0]
    lines: list[str] = []
    progress = RunProgress(lines.append, clock=lambda: now[0])
    watch = RoundWatch(progress, "training", 3, heartbeat=3600)
    now[0] = 40.0
    watch.replied()
    now[0] = 50.0
    watch.replied()
    now[0] = 52.0
    watch.replied()
    watch.close()
    assert lines == [
        "[   40 s] training: 1/3 client(s) replied after 40 s, about 80 s left at the rate so far",
        "[   50 s] training: 2/3 client(s) replied after 50 s, about 25 s left at the rate so far",
        "[   52 s] training: 3/3 client(s) replied after 52 s",
    ]
    many = RoundWatch(progress, "training", 64, heartbeat=3600)
    for _ in range(64):  # 64 clients that finish within 2 s: the first and the last are told
        now[0] += 2 / 64
        many.replied()
    many.close()
    assert [line.split("training: ")[1][:5] for line in lines[3:]] == ["1/64 ", "64/64"]
    del lines[3:]
    query = RoundWatch(progress, "query.temperature", 3, per_reply=False, heartbeat=3600)
    query.replied(3)  # the replies of other rounds are not told one by one
    query.close()
    assert len(lines) == 3


def test_a_wait_without_replies_is_told_on_a_timer():
    lines: list[str] = []
    progress = RunProgress(lines.append)
    watch = RoundWatch(progress, "training", 2, heartbeat=0.05)
    time.sleep(0.5)
    watch.close()
    assert len(lines) >= 3, lines  # about one per heartbeat, though no client replied
    assert all("training: 0/2 client(s) replied after" in line for line in lines)
    assert "left" not in lines[-1]  # no estimate before the first reply
    told = len(lines)
    time.sleep(0.2)
    assert len(lines) == told  # closed: the timer stopped


def test_a_bar_is_redrawn_between_events():
    class Bar:
        disable = False
        redraws = 0

        def refresh(self) -> None:
            self.redraws += 1

    bar = Bar()
    with redrawn(bar, seconds=0.02):
        time.sleep(0.3)
    drawn = bar.redraws
    assert drawn >= 5
    time.sleep(0.1)
    assert bar.redraws == drawn  # the block ended: no more redraws
    off = Bar()
    off.disable = True
    with redrawn(off, seconds=0.01):
        time.sleep(0.05)
    assert off.redraws == 0


def test_flowers_train_config_is_cut_and_its_final_results_said_to_be_its_summary():
    """Flower's strategy start logs the whole train ConfigRecord on one line (60 keys here);
    with the ServerApp's filter the line keeps its first keys and says how many there are, and
    the "Final results:" block is said to be Flower's round summary, not fedlmc's rows."""
    import logging

    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info
    from flwr.supercore import log

    from fedlmc.simulations.records.progress import shorten_flower_config_logs

    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("flwr")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        shorten_flower_config_logs()
        shorten_flower_config_logs()  # once only
        train = ConfigRecord({f"key-{i:02d}": i for i in range(60)})
        log_strategy_start_info(1, ArrayRecord(), train, ConfigRecord({"few": 1}))
        log(logging.INFO, "Final results:")  # what Strategy.start logs above its Result
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    line = next(m for m in messages if "ConfigRecord (train)" in m)
    assert len(line) < 320 and line.count("key-") < 20, line
    assert "'key-00': 0" in line and line.endswith(
        "(60 keys: the run config; `fedlmc keys` lists every key)"
    )
    assert next(m for m in messages if "ConfigRecord (evaluate)" in m).endswith("{'few': 1}")
    summary = next(m for m in messages if m.startswith("Final results"))
    assert "Flower's round summary" in summary and "'fedlmc result:'" in summary


def test_a_bar_into_a_file_writes_one_plain_line_per_update():
    from tqdm import tqdm

    from fedlmc.simulations.records.progress import bar_file

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    assert bar_file(terminal) is terminal
    log = io.StringIO()
    bar = tqdm(total=3, desc="quick", unit="cell", file=bar_file(log), ascii=True, mininterval=0)
    for _ in range(3):
        bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and "\x1b[" not in text, repr(text)
    lines = text.splitlines()
    assert [line.split("|")[0].split()[-1] for line in lines[:4]] == ["0%", "33%", "67%", "100%"]
