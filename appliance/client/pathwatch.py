"""Moves triggered by the path's quality: a client with a standby and ``MoveBounds`` measures
its own session's round trip to its appliance and moves the session when loss, latency or
jitter stay above a bound over a window (docs/fault-tolerance.md, "Session failover").

What is measured. Every ``probe_interval_ms`` the client sends a liveness probe (a repeat of
its login, as the silence probe is) carrying a probe number; the appliance answers it with
the session it made and the same number (``LOGIN_RESULT.probe``). The time from the probe to
its answer is one round-trip sample; a probe unanswered ``lost_after_ns`` after it went out
is a lost one. Over the samples resolved in the last ``window_s`` seconds:

- **latency**: the median round trip of the answered probes;
- **jitter**: the mean absolute difference of consecutive round trips (in the order the
  answers came), the quantity RFC 3550 smooths (its ``J``) taken over the window instead of
  an exponential average;
- **loss**: the lost probes over all the probes of a window of the same length whose fate
  is known: those sent ``lost_after_ns`` or more ago (so loss is judged that much later).

Latency and jitter are taken over the probes sent in the last ``window_s`` and answered.
A bound counts as exceeded only once the window has been measured whole (``window_s`` since
the measurement began, plus ``lost_after_ns`` for loss, and at least ``MIN_SAMPLES`` samples
in it: one slow answer is not a move), and not within ``hold_down_s`` of the session's
last move (or reconnection): a session does not flap between the two appliances faster
than that. The state is bounded: at most ``MAX_SAMPLES`` samples and ``MAX_OUTSTANDING``
unanswered probes.

``PathMonitor`` holds no socket and reads no clock: the client thread gives it the time.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

from appliance.client.errors import ClientError

MIN_SAMPLES = 5
"""Samples a window must hold before a bound is judged."""
MAX_SAMPLES = 4_096
"""Samples kept at most (a window longer than this many probe intervals keeps the latest)."""
MAX_OUTSTANDING = 64
"""Unanswered probes tracked at most (older ones count as lost at once)."""
LOST_AFTER_MIN_NS = 1_000_000_000
"""A probe unanswered this long is lost (or twice the latency bound, if that is longer: an
answer slower than the bound is a latency sample, not a loss)."""
WINDOW_MIN_S, WINDOW_MAX_S = 0.5, 3_600.0
PROBE_INTERVAL_MIN_MS, PROBE_INTERVAL_MAX_MS = 10.0, 10_000.0
HOLD_DOWN_MAX_S = 86_400.0
LATENCY_MAX_MS = 600_000.0


def _number(name: str, value: object, low: float, high: float, what: str, *,
            low_open: bool = False, high_open: bool = False) -> float:
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value)
          and (value > low if low_open else value >= low)
          and (value < high if high_open else value <= high))
    if not ok:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ClientError(f"move_on: {name} must be {what} in {lo}{low:g}, {high:g}{hi}, "
                          f"not {value!r}")
    return float(value)


@dataclass(frozen=True)
class MoveBounds:
    """When a client's session moves to its standby although its appliance still answers
    (``connect(..., standby=..., move_on=MoveBounds(...))``). A bound left None is not
    watched; at least one must be given."""

    latency_ms: float | None = None
    """Move when the median round trip over the window is above this (milliseconds)."""
    jitter_ms: float | None = None
    """Move when the mean difference of consecutive round trips is above this (ms)."""
    loss_ratio: float | None = None
    """Move when more than this share of the window's probes went unanswered (0 to 1)."""
    window_s: float = 5.0
    """The window the bounds are judged over (seconds)."""
    probe_interval_ms: float = 100.0
    """One probe this often while the bounds are watched."""
    hold_down_s: float = 30.0
    """No move for a bound within this long of the session's last move (or reconnection)."""

    def __post_init__(self) -> None:
        if self.latency_ms is None and self.jitter_ms is None and self.loss_ratio is None:
            raise ClientError("move_on: give at least one of latency_ms, jitter_ms, "
                              "loss_ratio")
        if self.latency_ms is not None:
            _number("latency_ms", self.latency_ms, 0, LATENCY_MAX_MS, "milliseconds",
                    low_open=True)
        if self.jitter_ms is not None:
            _number("jitter_ms", self.jitter_ms, 0, LATENCY_MAX_MS, "milliseconds",
                    low_open=True)
        if self.loss_ratio is not None:
            _number("loss_ratio", self.loss_ratio, 0, 1, "a ratio", low_open=True,
                    high_open=True)
        _number("window_s", self.window_s, WINDOW_MIN_S, WINDOW_MAX_S, "seconds")
        _number("probe_interval_ms", self.probe_interval_ms, PROBE_INTERVAL_MIN_MS,
                PROBE_INTERVAL_MAX_MS, "milliseconds")
        _number("hold_down_s", self.hold_down_s, 0, HOLD_DOWN_MAX_S, "seconds")
        if self.probe_interval_ms * MIN_SAMPLES > self.window_s * 1e3:
            raise ClientError(f"move_on: window_s ({self.window_s:g}) must hold at least "
                              f"{MIN_SAMPLES} probes of probe_interval_ms "
                              f"({self.probe_interval_ms:g})")


@dataclass(frozen=True)
class PathFigures:
    """One window's measurement."""

    samples: int
    """Probes resolved in the window (answered and lost)."""
    answered: int
    latency_ms: float | None
    """Median round trip of the answered ones (None: none answered)."""
    jitter_ms: float | None
    """Mean absolute difference of consecutive round trips (None: fewer than two)."""
    loss_ratio: float
    """Lost over resolved (0 when none resolved)."""


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.0f}" if ns >= 10e6 else f"{ns / 1e6:.1f}"


class PathMonitor:
    """The measurement of one client session's path and the judgement of its bounds."""

    def __init__(self, bounds: MoveBounds, now_ns: int) -> None:
        self.bounds = bounds
        self.interval_ns = int(bounds.probe_interval_ms * 1e6)
        self.window_ns = int(bounds.window_s * 1e9)
        self.hold_down_ns = int(bounds.hold_down_s * 1e9)
        self.lost_after_ns = max(LOST_AFTER_MIN_NS, int(2e6 * (bounds.latency_ms or 0)))
        self._samples: deque[tuple[int, int]] = deque(maxlen=MAX_SAMPLES)
        """(sent at, round trip ns or -1 for a lost probe), in the order resolved."""
        self._outstanding: dict[int, int] = {}
        """Probe number -> sent at."""
        self._next = 1
        self._next_at = 0
        self._began = now_ns
        self._moved_at = now_ns - self.hold_down_ns  # no hold-down at the first connection
        self.sent = 0
        self.answered = 0
        self.lost = 0
        self.late = 0
        """Answers that came after their probe had been counted lost (or were unknown)."""
        self._lock = threading.Lock()
        """The client thread measures; the application's thread may read the figures."""

    def restart(self, now_ns: int) -> None:
        """A new session (a move, a reconnection): measure anew, and hold down from now."""
        with self._lock:
            self._restart_locked(now_ns)

    def probe_due(self, now_ns: int) -> int:
        """The number of a probe to send now, or 0 (not due yet)."""
        with self._lock:
            return self._probe_due_locked(now_ns)

    def on_answer(self, number: int, now_ns: int) -> None:
        """The answer to probe ``number`` came at ``now_ns``."""
        with self._lock:
            self._on_answer_locked(number, now_ns)

    def figures(self, now_ns: int) -> PathFigures:
        """The window ending now."""
        with self._lock:
            return self._figures_locked(now_ns)

    def verdict(self, now_ns: int) -> tuple[str, str] | None:
        """(the bound exceeded, the reason naming it and the measured value) when the
        session should move now, else None."""
        with self._lock:
            return self._verdict_locked(now_ns)

    def _restart_locked(self, now_ns: int) -> None:
        """A new session (a move, a reconnection): measure anew, and hold down from now."""
        self._samples.clear()
        self._outstanding.clear()
        self._began = self._moved_at = now_ns
        self._next_at = 0

    def _probe_due_locked(self, now_ns: int) -> int:
        self._expire(now_ns)
        if now_ns < self._next_at:
            return 0
        self._next_at = now_ns + self.interval_ns
        number = self._next
        self._next += 1
        if len(self._outstanding) >= MAX_OUTSTANDING:
            oldest = min(self._outstanding)
            self._resolve(self._outstanding.pop(oldest), -1)
        self._outstanding[number] = now_ns
        self.sent += 1
        return number

    def _on_answer_locked(self, number: int, now_ns: int) -> None:
        sent = self._outstanding.pop(number, None)
        if sent is None:
            self.late += 1
            return
        self.answered += 1
        self._resolve(sent, max(0, now_ns - sent))

    def _resolve(self, sent_ns: int, rtt_ns: int) -> None:
        if rtt_ns < 0:
            self.lost += 1
        self._samples.append((sent_ns, rtt_ns))

    def _expire(self, now_ns: int) -> None:
        limit = now_ns - self.lost_after_ns
        for number, sent in list(self._outstanding.items()):
            if sent <= limit:
                del self._outstanding[number]
                self._resolve(sent, -1)

    def _figures_locked(self, now_ns: int) -> PathFigures:
        self._expire(now_ns)
        start = now_ns - self.window_ns
        # round trips: the probes sent in the window and answered (in the answers' order)
        answered = [rtt for sent, rtt in self._samples if sent >= start and rtt >= 0]
        # loss: the window of probes whose fate is known (sent lost_after_ns ago or more)
        end = now_ns - self.lost_after_ns
        known = [rtt for sent, rtt in self._samples if start - self.lost_after_ns < sent <= end]
        ordered = sorted(answered)
        n = len(ordered)
        median = None if not n else (ordered[n // 2] if n % 2 else
                                     (ordered[n // 2 - 1] + ordered[n // 2]) / 2)
        jitter = None if n < 2 else sum(
            abs(b - a) for a, b in zip(answered, answered[1:])) / (n - 1)
        lost = sum(1 for rtt in known if rtt < 0)
        return PathFigures(len(known), n, None if median is None else median / 1e6,
                           None if jitter is None else jitter / 1e6,
                           lost / len(known) if known else 0.0)

    def _verdict_locked(self, now_ns: int) -> tuple[str, str] | None:
        since = now_ns - self._began
        if since < self.window_ns or now_ns - self._moved_at < self.hold_down_ns:
            return None
        fig = self._figures_locked(now_ns)
        b = self.bounds
        over = f"over {b.window_s:g} s"
        if b.loss_ratio is not None and since >= self.window_ns + self.lost_after_ns \
                and fig.samples >= MIN_SAMPLES and fig.loss_ratio > b.loss_ratio:
            return "loss", (f"loss {fig.loss_ratio:.0%} of {fig.samples} probes above "
                            f"{b.loss_ratio:.0%} {over}")
        if fig.answered >= MIN_SAMPLES:
            if b.latency_ms is not None and fig.latency_ms is not None \
                    and fig.latency_ms > b.latency_ms:
                return "latency", (f"latency {_ms(fig.latency_ms * 1e6)} ms above "
                                   f"{b.latency_ms:g} ms {over}")
            if b.jitter_ms is not None and fig.jitter_ms is not None \
                    and fig.jitter_ms > b.jitter_ms:
                return "jitter", (f"jitter {_ms(fig.jitter_ms * 1e6)} ms above "
                                  f"{b.jitter_ms:g} ms {over}")
        return None
