"""What the widget tests share: a recording comm (every message the front end would get is
kept, stamped with the test's clock), the clock, and a job over a fixed event list. The
fixtures `clock` and `sent` that use them are in conftest.py."""

from __future__ import annotations

from typing import Any

from spotnb.views.widget.synthetic import synthetic_events

__all__ = ["EventsJob", "FakeClock", "RecordingComm", "events_of"]


class RecordingComm:
    """Stands in for the kernel's comm (like ipywidgets' DummyComm) and keeps what is sent,
    stamped with the test's clock."""

    kernel = "recording"
    _count = 0

    def __init__(self, clock: Any, log: list[tuple[float, str, dict[str, Any]]], **kwargs: Any) -> None:
        RecordingComm._count += 1
        self.comm_id = f"recording-{RecordingComm._count}"
        self.clock, self.log = clock, log
        self.open_data = kwargs.get("data")

    def open(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_msg(self, callback: Any) -> None:
        self.callback = callback

    def on_close(self, callback: Any) -> None:
        pass

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        self.log.append((self.clock(), self.comm_id, data))

    def close(self, *args: Any, **kwargs: Any) -> None:
        pass


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def events_of(**kwargs: Any) -> list[dict[str, Any]]:
    return [e for batch in synthetic_events(**kwargs) for e in batch]


class EventsJob:
    """The part of Job a view needs, over a fixed event list."""

    id = "job-1"

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.sinks: list[Any] = []
        self.stopped = False

    def add_sink(self, sink: Any, replay: bool = True) -> None:
        self.sinks.append(sink)
        if replay:
            sink.on_events(list(self.events))

    def remove_sink(self, sink: Any) -> None:
        if sink in self.sinks:
            self.sinks.remove(sink)

    def stop(self, wait: bool = True) -> None:
        self.stopped = True

    def summary(self) -> str:
        return "job-1 summary"
