"""The runners' log lines as tests match them (common/log.py writes them; both runners' loop tests read them)."""

import re


def train_line(step, loss, percent):
    """A CPU run's train log line of ``step``: its loss and progress exactly, its rate and time left any value."""
    return re.compile(rf"\| Train Device=cpu Step={step} Loss={loss:.5f} Rate=\d+\.\d\d samples/sec "
                      rf"\({percent}%, \d:\d\d:\d\d left\)$")


def assert_log(records, expected):
    """``records`` (level, message) match ``expected``: strings exactly, compiled patterns in full."""
    assert len(records) == len(expected), records
    for (level, message), (want_level, want) in zip(records, expected):
        assert level == want_level, (level, message)
        assert message == want if isinstance(want, str) else want.match(message), (message, want)


class TickingClock:
    """A clock for common.log's progress lines that moves on ``tick`` seconds at each reading
    (``monkeypatch.setattr(common.log, "clock", TickingClock(10))``), or only when moved by hand."""

    def __init__(self, tick=0.0):
        self.now, self.tick = 0.0, tick

    def __call__(self):
        self.now += self.tick
        return self.now
