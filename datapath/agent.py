"""Agents with duty cycles and the runner that drives them (Aeron/Agrona's AgentRunner model).

Every hot-loop component is an ``Agent``: ``do_work(now_ns) -> int`` does a bounded amount of
work and returns how much (0 = idle). An ``AgentRunner`` calls its agents in turn and feeds
the total to an idle strategy, so the same agents run on a dedicated thread or all in one
loop: the deployment changes, the code does not. Control reaches agents through a
``CommandQueue`` that the agent drains at the top of ``do_work`` (bounded per cycle).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

IDLE_SLEEP_NS = 1_000_000
"""SleepingIdle's pause (config key ``agent.idle_sleep_ns``)."""
BACKOFF_MAX_SPINS = 100
BACKOFF_MAX_YIELDS = 100
BACKOFF_MAX_PARK_NS = 1_000_000
COMMANDS_PER_CYCLE = 16
"""At most this many control commands are applied per duty cycle."""


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
            time.sleep(0)

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
            time.sleep(0)
        else:
            time.sleep(self._park_ns / 1e9)
            self._park_ns = min(self._park_ns * 2, self.max_park_ns)


class CommandQueue:
    """Control -> agent commands (the agent's *Proxy*): callables applied in the agent's loop.

    ``offer`` may be called from any thread; ``drain`` only from the agent's own.
    """

    def __init__(self) -> None:
        self._queue: deque[Callable[[], None]] = deque()

    def offer(self, command: Callable[[], None]) -> None:
        self._queue.append(command)

    def drain(self, limit: int = COMMANDS_PER_CYCLE) -> int:
        done = 0
        while done < limit:
            try:
                command = self._queue.popleft()
            except IndexError:
                break
            command()
            done += 1
        return done

    def __len__(self) -> int:
        return len(self._queue)


class AgentRunner:
    """Runs agents round-robin under one idle strategy, in the caller's thread or its own."""

    def __init__(self, agents: Sequence[Agent], idle: IdleStrategy | None = None,
                 name: str = "agent-runner") -> None:
        self.agents = list(agents)
        self.idle = idle or BackoffIdle()
        self.name = name
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
        """Run on a dedicated daemon thread."""
        self._thread = threading.Thread(target=self._run_quietly, name=self.name, daemon=True)
        self._thread.start()
        return self

    def _run_quietly(self) -> None:
        try:
            self.run()
        except BaseException:  # kept in self.error for whoever stops the runner
            pass

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the runner to stop and wait for its thread; re-raise an agent's failure."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self.error is not None:
            raise self.error

    def __enter__(self) -> AgentRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
