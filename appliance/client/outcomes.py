"""The outcome of each guaranteed message a client publishes: acknowledged by the appliance,
or failed with a reason.

``publish(..., qos="guaranteed")`` returns an ``Outcome`` (future-like: ``done()``,
``result(timeout)``, ``exception(timeout)``, ``add_done_callback(fn)``). The client's
``OutcomeTracker`` holds the outcomes not yet resolved, in sequence order: the appliance's
cumulative ACK of the client's reliable stream resolves every outcome up to it; a range its
sender could no longer retransmit (answered with LOSS), a lost connection and ``close`` fail
them. What failed since the last report is counted (by reason) for ``Client.flush``, so a
failure is never only in an outcome the application dropped.

Bounds: the outcomes held are those of messages sent and not yet acknowledged, which the
reliable sender's send window and pending queue bound (a publish past them is refused).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable

from appliance.client.errors import PublishFailedError

log = logging.getLogger("topicwire.client")

PENDING = "pending"
ACKNOWLEDGED = "acknowledged"
FAILED = "failed"

REASON_LOST = "appliance lost"
REASON_CLOSED = "session closed"
REASON_REFUSED = "refused"


class Outcome:
    """The outcome of one guaranteed message (its ``sequence`` on the client's reliable
    stream, its ``topic``): pending, then acknowledged or failed (``reason``)."""

    __slots__ = ("sequence", "topic", "state", "reason", "_callbacks", "_tracker", "_message",
                 "first_sequence")

    def __init__(self, tracker: OutcomeTracker, sequence: int, topic: str) -> None:
        self._tracker = tracker
        self.sequence = sequence
        self.topic = topic
        self.state = PENDING
        self.reason: str | None = None
        self._callbacks: list[Callable[[Outcome], None]] | None = None
        self._message: tuple | None = None
        self.first_sequence: int | None = None
        """A message published as segments: the sequence of its first (``sequence`` is its
        last's); a loss of any of them fails the outcome."""
        """(key, payload, publish time, namespace, schema) when the client sends it again
        after a reconnection (``connect(..., resend=True)``)."""

    def __repr__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"<Outcome {self.topic!r} #{self.sequence} {self.state}{why}>"

    def done(self) -> bool:
        return self.state != PENDING

    @property
    def acknowledged(self) -> bool:
        return self.state == ACKNOWLEDGED

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until resolved (at most ``timeout`` seconds); whether it is."""
        return self._tracker._wait_for(self.done, timeout)

    def result(self, timeout: float | None = None) -> int:
        """The message's sequence once acknowledged; ``PublishFailedError`` if it failed,
        ``TimeoutError`` if still pending after ``timeout`` seconds."""
        if not self.wait(timeout):
            raise TimeoutError(f"client: guaranteed message #{self.sequence} to {self.topic!r} "
                               f"not acknowledged within {timeout} s")
        error = self._error()
        if error is not None:
            raise error
        return self.sequence

    def exception(self, timeout: float | None = None) -> PublishFailedError | None:
        """The failure (None when acknowledged); ``TimeoutError`` as ``result``."""
        if not self.wait(timeout):
            raise TimeoutError(f"client: guaranteed message #{self.sequence} to {self.topic!r} "
                               f"not acknowledged within {timeout} s")
        return self._error()

    def _error(self) -> PublishFailedError | None:
        if self.state != FAILED:
            return None
        return PublishFailedError(f"guaranteed message #{self.sequence} to {self.topic!r} was "
                                  f"not acknowledged: {self.reason}; publish it again",
                                  reason=str(self.reason))

    def add_done_callback(self, fn: Callable[[Outcome], None]) -> None:
        """Call ``fn(outcome)`` once resolved (at once if it is). It runs on the thread that
        resolves it (the client's thread for acknowledgements): keep it short, and do not
        wait in it for the client."""
        with self._tracker._cond:
            if self.state == PENDING:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        _call(fn, self)


def _call(fn: Callable[[Outcome], None], outcome: Outcome) -> None:
    try:
        fn(outcome)
    except Exception:  # an application's callback must not end the client's thread
        log.exception("client: an outcome callback raised")


class OutcomeTracker:
    """The client's unresolved outcomes (in sequence order) and the failures not yet
    reported by ``flush``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: deque[Outcome] = deque()
        self._unreported: Counter[str] = Counter()
        self.acknowledged = 0
        """Guaranteed messages acknowledged so far."""
        self.failed = 0
        """Guaranteed messages whose outcome failed so far."""

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, outcome: Outcome, callback: Callable[[Outcome], None] | None) -> None:
        with self._cond:
            if callback is not None:
                outcome._callbacks = [callback]
            self._pending.append(outcome)

    def acknowledge_upto(self, sequence: int) -> None:
        """The appliance acknowledged every sequence up to ``sequence``."""
        done: list[Outcome] = []
        with self._cond:
            pending = self._pending
            if not pending or pending[0].sequence > sequence:
                return
            while pending and pending[0].sequence <= sequence:
                outcome = pending.popleft()
                if outcome.state == PENDING:
                    outcome.state = ACKNOWLEDGED
                    outcome._message = None
                    self.acknowledged += 1
                    if outcome._callbacks:
                        done.append(outcome)
            self._cond.notify_all()
        self._run_callbacks(done)

    def fail_range(self, first: int, last: int, reason: str) -> int:
        """Fail the pending outcomes of sequences ``first..last`` (the sender can no longer
        retransmit them); they stay queued until the acknowledgement passes them."""
        done: list[Outcome] = []
        with self._cond:
            for outcome in self._pending:
                if (outcome.first_sequence or outcome.sequence) > last:
                    break
                if outcome.sequence >= first and outcome.state == PENDING:
                    self._fail(outcome, reason, done)
            self._cond.notify_all()
        self._run_callbacks(done)
        return len(done)

    def fail_all(self, reason: str) -> int:
        """Fail every pending outcome (the session they were sent on is gone); how many."""
        done: list[Outcome] = []
        with self._cond:
            while self._pending:
                outcome = self._pending.popleft()
                if outcome.state == PENDING:
                    self._fail(outcome, reason, done)
            self._cond.notify_all()
        self._run_callbacks(done)
        return len(done)

    def detach_pending(self) -> list[Outcome]:
        """Take every pending outcome out, still pending (to be sent again), in order."""
        with self._cond:
            out = [o for o in self._pending if o.state == PENDING]
            self._pending.clear()
            self._cond.notify_all()
            return out

    def fail_detached(self, outcomes: list[Outcome], reason: str) -> int:
        """Fail outcomes ``detach_pending`` took out (they could not be sent again)."""
        done: list[Outcome] = []
        with self._cond:
            for outcome in outcomes:
                if outcome.state == PENDING:
                    self._fail(outcome, reason, done)
            self._cond.notify_all()
        self._run_callbacks(done)
        return len(done)

    def _fail(self, outcome: Outcome, reason: str, done: list[Outcome]) -> None:
        outcome.state = FAILED
        outcome.reason = reason
        self.failed += 1
        self._unreported[reason] += 1
        done.append(outcome)

    def _run_callbacks(self, done: list[Outcome]) -> None:
        for outcome in done:
            callbacks, outcome._callbacks = outcome._callbacks, None
            for fn in callbacks or ():
                _call(fn, outcome)

    def unacknowledged(self) -> int:
        """Outcomes still pending."""
        with self._cond:
            return sum(1 for o in self._pending if o.state == PENDING)

    def wait_all(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until no outcome is pending; how many still are."""
        self._wait_for(lambda: not any(o.state == PENDING for o in self._pending), timeout_s)
        return self.unacknowledged()

    def take_unreported(self) -> Counter[str]:
        """The failures since the last report, by reason (and forget them)."""
        with self._cond:
            out, self._unreported = self._unreported, Counter()
            return out

    def _wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True


def describe(failed: Counter[str] | dict[str, int]) -> str:
    """``"12 appliance lost, 3 session closed"`` (most first)."""
    return ", ".join(f"{n} {reason}" for reason, n in Counter(failed).most_common())
