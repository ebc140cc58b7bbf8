"""Agents with duty cycles and the runner that drives them (Aeron/Agrona's AgentRunner model).

Every hot-loop component is an ``Agent``: ``do_work(now_ns) -> int`` does a bounded amount of
work and returns how much (0 = idle). An ``AgentRunner`` calls its agents in turn and feeds
the total to an idle strategy, so the same agents run on a dedicated thread or all in one
loop: the deployment changes, the code does not. Control reaches agents through a
``CommandQueue`` that the agent drains at the top of ``do_work`` (bounded per cycle).

``PollingIdle`` is the idle strategy for an agent whose work arrives on sockets and must
not burn a core: after a short spin/yield phase it blocks in poll(2) on the agent's
descriptors (``WaitSet``) and on an ``AgentWakeup`` that the control side signals when it
offers a command, so a datagram or a command ends the park at once; the park time
(``POLL_MAX_PARK_NS``) bounds how late the agent's timers run.
"""

from __future__ import annotations

import math
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

IDLE_SLEEP_NS = 1_000_000
"""SleepingIdle's pause (config key ``agent.idle_sleep_ns``)."""
IDLE_MAX_WAIT_NS = 1_000_000_000
"""``WakeableIdle`` waits at most this long even with no deadline sooner (a safety net: the
agent's timers say when it is due)."""
BACKOFF_MAX_SPINS = 100
BACKOFF_MAX_YIELDS = 100
BACKOFF_MAX_PARK_NS = 1_000_000
POLL_MAX_PARK_NS = 1_000_000
"""PollingIdle's longest block in poll(2) (``appliance.idle = "block"``): an idle agent's
timers run at least this often, as under BackoffIdle's longest park."""
POLL_LONGEST_PARK_NS = 1_000_000_000
"""With a complete wait set and an agent that says when its next timer is due
(``wake_at_ns``), PollingIdle parks until then, but never longer than this."""
POLL_SPIN_NS = 1_000_000
"""How long PollingIdle keeps polling (spinning, releasing the GIL each idle cycle) after
the agent's last work before it parks: a message that follows within this long finds the
agent running and its caches warm, as under BackoffIdle's spin and yield phases (config key
``appliance.idle_spin_us``)."""
COMMANDS_PER_CYCLE = 16
"""At most this many control commands are applied per duty cycle."""


def set_thread_priority(nice: int) -> None:
    """Give the calling thread the nice value ``nice`` (Linux schedules threads one by one;
    below 0 needs root or CAP_SYS_NICE: ``PermissionError`` otherwise)."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def yield_cpu() -> None:
    """Let another runnable thread have the GIL and the CPU, without sleeping.

    ``os.sched_yield`` releases the GIL around the system call (~1 us here). Not
    ``time.sleep(0)``: that is a ``clock_nanosleep`` which the kernel's timer slack (50 us by
    default for normal threads) stretches to ~60 us, so a "spinning" agent would look for
    work only every ~70 us and a frame would wait half of that on average before anyone
    reads it."""
    os.sched_yield()


class Agent(Protocol):
    """A unit of hot-loop work."""

    name: str

    def do_work(self, now_ns: int) -> int:
        """Do a bounded amount of work; return the amount done (0 means idle)."""
        ...

    def on_close(self) -> None:
        """Release what the agent owns; called once when its runner stops."""
        ...


class IdleStrategy(Protocol):
    def idle(self, work_count: int) -> None: ...

    def reset(self) -> None: ...


class BusySpinIdle:
    """Never yields the CPU: lowest latency, one core per runner."""

    def idle(self, work_count: int) -> None:
        return None

    def reset(self) -> None:
        return None


class YieldingIdle:
    def idle(self, work_count: int) -> None:
        if work_count == 0:
            yield_cpu()

    def reset(self) -> None:
        return None


class WakeableIdle:
    """Idle until woken or until the agent's next deadline: for agents whose work arrives by
    hand-off (a queue another thread fills and then ``wakeup.set()``s) or falls due at times
    they know (``wake_at_ns(now_ns)``, CLOCK_MONOTONIC ns). Nothing polls: an idle agent
    sleeps in ``Event.wait`` until one of the two, so it takes no CPU (and no GIL) between.
    The event is cleared after each wait, before the next duty cycle looks for work, so a
    hand-off made while the cycle runs ends the next wait at once and none is lost."""

    def __init__(self, wakeup: threading.Event, wake_at_ns: Callable[[int], int],
                 max_wait_ns: int = IDLE_MAX_WAIT_NS) -> None:
        self.wakeup = wakeup
        self.wake_at_ns = wake_at_ns
        self.max_wait_ns = max_wait_ns
        self.waits = 0
        """Idle waits so far (each one a sleep that ended by a wake-up or a deadline)."""

    def idle(self, work_count: int) -> None:
        if work_count > 0:
            return
        now = time.monotonic_ns()
        wait_ns = min(self.wake_at_ns(now) - now, self.max_wait_ns)
        if wait_ns > 0:
            self.waits += 1
            self.wakeup.wait(wait_ns / 1e9)
        self.wakeup.clear()

    def reset(self) -> None:
        return None


class SleepingIdle:
    def __init__(self, sleep_ns: int = IDLE_SLEEP_NS) -> None:
        self.sleep_s = sleep_ns / 1e9

    def idle(self, work_count: int) -> None:
        if work_count == 0:
            time.sleep(self.sleep_s)

    def reset(self) -> None:
        return None


class BackoffIdle:
    """Spin, then yield, then park with exponential backoff up to ``max_park_ns``."""

    def __init__(self, max_spins: int = BACKOFF_MAX_SPINS, max_yields: int = BACKOFF_MAX_YIELDS,
                 max_park_ns: int = BACKOFF_MAX_PARK_NS) -> None:
        self.max_spins = max_spins
        self.max_yields = max_yields
        self.max_park_ns = max_park_ns
        self.reset()

    def reset(self) -> None:
        self._spins = 0
        self._yields = 0
        self._park_ns = 1_000

    def idle(self, work_count: int) -> None:
        if work_count > 0:
            self.reset()
        elif self._spins < self.max_spins:
            self._spins += 1
        elif self._yields < self.max_yields:
            self._yields += 1
            yield_cpu()
        else:
            time.sleep(self._park_ns / 1e9)
            self._park_ns = min(self._park_ns * 2, self.max_park_ns)


class AgentWakeup:
    """An eventfd that ends a ``PollingIdle`` park: the control side ``signal``s it after
    offering work (a command, a frame to send) so the agent does not sleep on it."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def signal(self) -> None:
        """Make ``fd`` readable (any thread; a no-op once closed)."""
        fd = self.fd
        if fd >= 0:
            try:
                os.eventfd_write(fd, 1)
            except OSError:  # closed under us, or the counter is saturated: already readable
                pass

    def clear(self) -> bool:
        """Consume the pending signals; whether there were any."""
        try:
            return os.eventfd_read(self.fd) > 0
        except (BlockingIOError, OSError):
            return False

    def close(self) -> None:
        """Release the eventfd; safe to call twice."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> AgentWakeup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class WaitSet(NamedTuple):
    """What a ``PollingIdle`` may block on: ``fds`` poll readable when the agent has input;
    ``complete`` is False when some input arrives without any descriptor becoming readable
    (a shared-memory ring), so the park must stay short."""

    fds: tuple[int, ...]
    complete: bool


class PollingIdle:
    """Spin for ``spin_ns`` after the last work, then block in poll(2) on the agent's
    descriptors and its wakeup.

    ``wait_set()`` is asked at every park (descriptors may come and go). When it is
    complete the park is one poll of up to ``max_park_ns``, ended at once by a readable
    descriptor or a ``wakeup`` signal. When it is not, the parks grow as BackoffIdle's
    (a bounded sleep, ``sleeps``) until they reach ``max_park_ns``, which is spent in poll,
    so a source without a descriptor is not left waiting longer than it is today. Counts:
    ``polls`` (parks in poll), ``wakes_ready`` (a descriptor was readable),
    ``wakes_command`` (the wakeup), ``timeouts`` and ``sleeps``.

    ``spin_worth()`` (optional) says whether the work that ended was of the kind that comes
    in runs (data): when it says no (a heartbeat, a timer), the agent parks at once instead
    of spinning ``spin_ns`` for a next frame no one is sending (``skipped_spins``).
    """

    def __init__(self, wait_set: Callable[[], WaitSet], wakeup: AgentWakeup | None = None, *,
                 spin_ns: int = POLL_SPIN_NS, max_park_ns: int = POLL_MAX_PARK_NS,
                 wake_at_ns: Callable[[int], int] | None = None,
                 longest_park_ns: int = POLL_LONGEST_PARK_NS,
                 spin_worth: Callable[[], bool] | None = None) -> None:
        if max_park_ns <= 0:
            raise ValueError(f"agent: max_park_ns must be positive, not {max_park_ns}")
        self.wait_set = wait_set
        self.wakeup = wakeup
        self.spin_ns = spin_ns
        self.max_park_ns = max_park_ns
        self.wake_at_ns = wake_at_ns
        """The agent's next deadline (CLOCK_MONOTONIC ns): with a complete wait set, a park
        lasts until then (at most ``longest_park_ns``) instead of ``max_park_ns``."""
        self.longest_park_ns = longest_park_ns
        self.spin_worth = spin_worth
        self.skipped_spins = 0
        self._timeout_ms = max(1, math.ceil(max_park_ns / 1e6))
        self._poller = select.poll()
        self._registered: tuple[int, ...] = ()
        self.polls = 0
        self.wakes_ready = 0
        self.wakes_command = 0
        self.timeouts = 0
        self.sleeps = 0
        self.reset()

    def reset(self) -> None:
        self._idle_since_ns = 0
        self._park_ns = 1_000

    def idle(self, work_count: int) -> None:
        if work_count > 0:
            self.reset()
            return
        if self.spin_ns > 0:
            now_ns = time.monotonic_ns()
            if self._idle_since_ns == 0:
                self._idle_since_ns = now_ns
                if self.spin_worth is not None and not self.spin_worth():
                    self._idle_since_ns = now_ns - self.spin_ns  # nothing to spin for
                    self.skipped_spins += 1
            if now_ns - self._idle_since_ns < self.spin_ns:
                yield_cpu()  # lets the control thread take the GIL
                return
        self.park()

    def park(self) -> None:
        """One park: a bounded sleep or one poll (see the class docstring)."""
        fds, complete = self.wait_set()
        if any(fd < 0 for fd in fds):  # a channel closed under us (a client reconnecting)
            fds = tuple(fd for fd in fds if fd >= 0)
        if not complete and self._park_ns < self.max_park_ns:
            time.sleep(self._park_ns / 1e9)
            self._park_ns = min(self._park_ns * 2, self.max_park_ns)
            self.sleeps += 1
            return
        wakeup = self.wakeup
        if wakeup is not None and wakeup.fd >= 0:
            fds = (*fds, wakeup.fd)
        if fds != self._registered:
            for fd in set(self._registered):
                self._poller.unregister(fd)
            for fd in set(fds):
                self._poller.register(fd, select.POLLIN)
            self._registered = fds
        self.polls += 1
        timeout_ms = self._timeout_ms
        if complete and self.wake_at_ns is not None:  # nothing else to look at: sleep on
            now = time.monotonic_ns()
            park_ns = min(self.wake_at_ns(now) - now, self.longest_park_ns)
            timeout_ms = max(timeout_ms, math.ceil(park_ns / 1e6))
        events = self._poller.poll(timeout_ms)
        if not events:
            self.timeouts += 1
            return
        ready = False
        for fd, mask in events:
            if mask & select.POLLNVAL:  # closed under us: register afresh next park
                self._forget()
            elif wakeup is not None and fd == wakeup.fd:
                wakeup.clear()
                self.wakes_command += 1
            else:
                ready = True
        if ready:
            self.wakes_ready += 1

    def wake(self) -> None:
        """End the current park (``AgentRunner.stop`` calls it)."""
        if self.wakeup is not None:
            self.wakeup.signal()

    def _forget(self) -> None:
        self._poller = select.poll()
        self._registered = ()


class CommandQueue:
    """Control -> agent commands (the agent's *Proxy*), applied in the agent's loop.

    A command is ``(method name, args)``, applied as ``getattr(target, name)(*args)``: plain
    data, so the same commands cross to a data path in another process
    (appliance/dataplane/process.py); a callable is also taken (tests wrap channels that
    way). ``offer`` may be called from any thread; ``drain`` only from the agent's own. With
    a ``wakeup``, every offer signals it (ends a ``PollingIdle`` park). ``applied`` counts
    the commands run so far.
    """

    def __init__(self, wakeup: AgentWakeup | None = None, target: object = None) -> None:
        self._queue: deque[tuple[str, tuple] | Callable[[], None]] = deque()
        self.wakeup = wakeup
        self.target = target
        self.applied = 0

    def offer(self, command: tuple[str, tuple] | Callable[[], None]) -> None:
        self._queue.append(command)
        if self.wakeup is not None:
            self.wakeup.signal()

    def put(self, command: tuple[str, tuple]) -> None:
        """``offer`` from the agent's own thread (no wakeup needed)."""
        self._queue.append(command)

    def drain(self, limit: int = COMMANDS_PER_CYCLE) -> int:
        done = 0
        try:
            while done < limit:
                try:
                    command = self._queue.popleft()
                except IndexError:
                    break
                done += 1
                if type(command) is tuple:
                    name, args = command
                    getattr(self.target, name)(*args)
                else:
                    command()  # type: ignore[operator]
        finally:
            self.applied += done
        return done

    def __len__(self) -> int:
        return len(self._queue)


class AgentRunner:
    """Runs agents round-robin under one idle strategy, in the caller's thread or its own."""

    def __init__(self, agents: Sequence[Agent], idle: IdleStrategy | None = None,
                 name: str = "agent-runner", on_start: Callable[[], None] | None = None
                 ) -> None:
        """``on_start`` runs first on the runner's own thread (e.g. its scheduling priority);
        ``start`` waits for it and raises what it raised."""
        self.agents = list(agents)
        self.idle = idle or BackoffIdle()
        self.name = name
        self.on_start = on_start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0
        self.error: BaseException | None = None

    def run_once(self) -> int:
        now_ns = time.monotonic_ns()
        work = 0
        for agent in self.agents:
            work += agent.do_work(now_ns)
        self.cycles += 1
        return work

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Duty-cycle until ``stop()`` (or ``until()`` is true); then close the agents."""
        try:
            while not self._stop.is_set() and not (until and until()):
                self.idle.idle(self.run_once())
        except BaseException as exc:  # surfaced to whoever joins the runner
            self.error = exc
            raise
        finally:
            for agent in self.agents:
                agent.on_close()

    def start(self) -> AgentRunner:
        """Run on a dedicated daemon thread, once ``on_start`` has run there (its error is
        raised here, and the agents are closed)."""
        started = threading.Event()
        failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run_quietly, args=(started, failed),
                                        name=self.name, daemon=True)
        self._thread.start()
        started.wait()
        if failed:
            self._thread.join()
            self._thread = None
            raise failed[0]
        return self

    def _run_quietly(self, started: threading.Event, failed: list[BaseException]) -> None:
        try:
            if self.on_start is not None:
                self.on_start()
        except BaseException as exc:
            failed.append(exc)
            for agent in self.agents:
                agent.on_close()
            return
        finally:
            started.set()
        try:
            self.run()
        except BaseException:  # kept in self.error for whoever stops the runner
            pass

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the runner to stop and wait for its thread; re-raise an agent's failure."""
        self._stop.set()
        wake = getattr(self.idle, "wake", None)
        if wake is not None:  # a strategy that blocks: end its park now
            wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self.error is not None:
            raise self.error

    def __enter__(self) -> AgentRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
