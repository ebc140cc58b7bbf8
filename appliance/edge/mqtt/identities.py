"""One native client session per P&M identity, shared by every MQTT session of that identity
(connected or offline) on this edge.

The first CONNECT of an identity logs in a native client (``appliance.client.connect``) as
that identity; later CONNECTs of the same identity join it; it logs out when the last MQTT
session of the identity ends. So an MQTT connection costs no thread, socket or appliance
session of its own: an edge holds as many connections as ``mqtt.max_connections`` and the
open-file limit allow, and ``clients.max_sessions`` bounds identities, not connections.
Entitlements are per identity, so the appliance checks the shared session exactly as it
checked one session per connection.

**Subscriptions.** The identity's native subscriptions are the union of its MQTT sessions'
filters, reference-counted per native pattern (each subscribed in both native classes,
best-effort and guaranteed, each with ``own_class``: a message comes once, in its class,
the appliance leaving the other copy out; handle_subscribe.py). A SUBSCRIBE of a pattern the
identity holds natively needs no native call (the earlier subscribe's success is the
entitlement check; a refusal is not cached, so a refused filter is asked again). The new
patterns asked for within one wake-up of the event loop go in one native ``subscribe_many``
per class (one request, one table compile at the appliance), each waiter answered with its
own pattern's outcome; the eager unsubscribes of one wake-up likewise go in one
``unsubscribe_many``. An
UNSUBSCRIBE, or a session's end, withdraws the native pattern only when no session of the
identity still holds it: at once while the identity holds at most ``EAGER_UNSUBSCRIBE_PATTERNS``
patterns; beyond, the pattern lingers (its messages reach the edge and are dropped,
``deliveries_unmatched``) until lingering patterns outnumber live ones, when the native list
is rebuilt in one go (a native unsubscribe costs the client library time in proportion to
the patterns it holds, so this keeps the cost per unsubscribe bounded on average).

**Deliveries.** Messages arrive on the native client's thread (``on_native``), are handed to
the event loop in batches (an inbox: the message that finds it empty schedules one call on
the loop, which takes all that came meanwhile; at most ``NATIVE_PENDING_MESSAGES`` waiting
per identity) and demultiplexed
there to the sessions whose filters match: a dict of exact patterns and a set of wildcard
patterns per identity, each pattern naming its (session, filter) references. Each session
then applies its own options (QoS, No Local, Retain As Published, subscription identifiers,
shared groups) and its own bounded queue (sessions.py), so a slow subscriber drops and counts
its own deliveries without holding up the others of its identity.

**No Local.** The native no-local test (the message came from my native session) cannot tell
the sessions of one identity apart any more. A PUBLISH from a session that holds a No Local
filter matching the topic carries the header ``mqtt.sender`` = the session's number on this
edge (meta.py); a delivery from this edge's own native session of the identity whose
``mqtt.sender`` is a session's number does not go to that session's No Local filters, and
does go to the other sessions of the identity.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from appliance.client.errors import (
    BusyError,
    ClientError,
    ConnectionLostError,
    EntitlementError,
    NoAnswerError,
)
from appliance.client.messages import GUARANTEED_QOS
from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from appliance.edge.mqtt.meta import SENDER_HEADER, from_headers
from appliance.edge.mqtt.topics import mqtt_matches

if TYPE_CHECKING:
    from appliance.edge.mqtt.server import MqttServer
    from appliance.edge.mqtt.sessions import SessionState

log = logging.getLogger("topicwire.edge.mqtt")

NATIVE_PENDING_MESSAGES = 10_000
"""Messages from the fabric handed to the event loop and not yet demultiplexed, per MQTT
session of the identity (the budget each connection had with a native session of its own),
at most ``NATIVE_PENDING_MAX`` for one identity; more are dropped and counted
(``deliveries_dropped_backlog``)."""
NATIVE_PENDING_MAX = 1_000_000
"""The most messages one identity may have waiting for the event loop, whatever its
sessions."""
EAGER_UNSUBSCRIBE_PATTERNS = 256
"""An identity holding at most this many native patterns withdraws an unneeded one at once;
beyond, it lingers until lingering patterns outnumber live ones (module docstring)."""
REGISTERED_TOPICS = 16_384
"""Topics per identity remembered as registered with the appliance (``register``): their
publishes need no step off the event loop; a publish of another topic asks the native
session once more (which answers at once for a topic it registered before)."""
NATIVE_WAIT_S = 30.0
"""How long a native request of an identity's session waits for the appliance, retries
included (``IdentitySession._asked_again``): the registration of the first publish of a
topic, a subscribe, an unsubscribe; then its connection closes
(``closed_native_register_timeout``, ``closed_native_subscribe_timeout``,
``closed_native_unsubscribe_failed``)."""
REGISTER_BATCH_TOPICS = 2_048
"""Topics one native ``register_many`` of an identity asks at most (two or three
REGISTRY_UPDATE frames): the others wait for the next batch. 5,000 in one request went
unanswered past the native request timeout again and again at 5,000 connections while the
native client's thread spent ~90 ms routing each new topic's first message (appliance/
client/routes.py) and sent every frame of the request again while any topic was
unanswered; batches of 256 were answered, but at 5,000 connections their 20 round trips,
each waiting its turn on an event loop busy with the probes, took minutes."""
NATIVE_RETRY_S = 0.5
"""A native request the appliance did not answer (``NoAnswerError``), could not take yet
(``BusyError``: the session's earlier requests still wait for their answer) or that could
not be asked while the native session was lost (``ConnectionLostError``) is asked again
after this long."""
NATIVE_RESUBSCRIBE_FACTOR = 4
"""After this many native subscribes per held pattern, an unsubscribe rebuilds the native
session's list from scratch (each native subscribe keeps a subscription object)."""

T = TypeVar("T")
Ref = tuple["SessionState", str]
"""(an MQTT session, one of its filter keys)."""


class _Gate:
    """Native subscribes of an identity run side by side (the appliance then compiles its
    tables once for many); an unsubscribe or a rebuild runs alone."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._alone = False

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._alone)
            self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._alone and self._shared == 0)
            self._alone = True
        try:
            yield
        finally:
            async with self._cond:
                self._alone = False
                self._cond.notify_all()


class IdentitySession:
    """The shared native session of one identity; see the module docstring."""

    def __init__(self, server: MqttServer, identity: str) -> None:
        self.server = server
        self.identity = identity
        self.native: Any = None
        """The native ``appliance.client.Client`` (None until logged in, and once closed)."""
        self.members: set[SessionState] = set()
        self.refs: dict[str, set[Ref]] = {}
        """Native pattern -> the (session, filter key) holding it (empty: lingering)."""
        self.wildcards: set[str] = set()
        """The patterns of ``refs`` with ``+`` or ``#`` (the others match by lookup)."""
        self.guaranteed: set[str] = set()
        """Patterns subscribed in the native guaranteed class too."""
        self.lingering: set[str] = set()
        self.registered: set[str] = set()
        """Topics the native session registered (at most ``REGISTERED_TOPICS``)."""
        self.native_subscribes = 0
        self.closing = False
        self._login: asyncio.Future | None = None
        self._pending: dict[str, asyncio.Future] = {}
        self._sub_batch: list[tuple[str, asyncio.Future]] = []
        """Native subscribes asked for in this wake-up of the event loop (one request), or
        while the previous batch ran."""
        self._sub_running = False
        self._reg_batch: dict[str, list[asyncio.Future]] = {}
        """Topics whose first publish came in this wake-up of the event loop (one native
        ``register_many``), or while the previous batch ran -> their publishes' waiters."""
        self._reg_running = False
        self._unsub_batch: tuple[list[str], asyncio.Future] | None = None
        """Native unsubscribes asked for in this wake-up (one request), and their end."""
        self._gate = _Gate()
        self._queued = 0
        self._queued_lock = threading.Lock()
        self._inbox: list[Any] = []
        """Messages from the client thread waiting for the loop (``_take_inbox``)."""
        self._last_native: Any = None

    def count(self, name: str, n: int = 1) -> None:
        self.server.count(name, n)

    # --- login and logout ------------------------------------------------------------------
    async def ready(self) -> None:
        """Logged in (the first caller logs in; the others wait for it). Raises the login's
        ``ClientError`` (``LoginError``: P&M refused the identity)."""
        if self.native is not None:
            return
        if self._login is None:
            self._login = self.server.loop.create_task(self._log_in())
        login = self._login
        try:
            await asyncio.shield(login)
        except BaseException as exc:
            if self._login is login:
                self._login = None  # the next CONNECT tries again
                log.warning("mqtt: the native login of identity %r failed (%s: %s); its "
                            "CONNECTs are refused", self.identity, type(exc).__name__, exc)
            raise

    async def _log_in(self) -> None:
        native = await self.server.blocking(self.server.native_login, self.identity)
        if self.closing:  # every member left meanwhile
            await self.server.blocking(native.close)
            raise ClientError("the identity's sessions ended during the login")
        native.hold_frames = True  # its publishes leave at the end of each wake-up
        self.native = native
        self.count("native_logins")

    async def leave(self, state: SessionState) -> None:
        """``state`` ended: its filters are released; the last member logs the native
        session out (without withdrawing its patterns one by one)."""
        self.members.discard(state)
        if not self.members:
            await self.close()
            return
        if self.server.stopping:  # (every native session logs out in a moment)
            return
        for key, opts in list(state.filters.items()):
            await self.release(state, key, opts.match)

    async def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        server = self.server
        if server.identities.get(self.identity) is self:
            del server.identities[self.identity]
        login, self._login = self._login, None
        if login is not None and not login.done():
            try:
                await asyncio.shield(login)
            except BaseException:  # (it closes what it logged in)
                pass
        native, self.native = self.native, None
        if native is not None:
            self.count("native_logouts")
            await server.blocking(native.close)

    # --- registrations ---------------------------------------------------------------------
    async def register(self, topic: str) -> None:
        """The first publish of ``topic`` by this identity: the native session registers it
        (then its publishes need no round trip: ``registered``). The topics asked for within
        one wake-up of the event loop go in one native ``register_many`` (one request, one
        pass at the appliance), one batch at a time per identity; the caller (the
        publisher's read loop) waits meanwhile, asked again while unanswered
        (``_asked_again``). Raises ``EntitlementError`` when P&M refuses the topic,
        ``NoAnswerError`` past ``NATIVE_WAIT_S``, ``ClientError`` for a native session that
        is closed."""
        if topic not in self.registered:
            await self._asked_again(lambda: self._register_batched(topic),
                                    "native_register_retries",
                                    lambda: topic in self.registered)

    def _register_batched(self, topic: str) -> asyncio.Future:
        """``topic`` in the next registration batch: its waiter."""
        waiter = self.server.loop.create_future()
        if not self._reg_batch and not self._reg_running:
            self.server.loop.call_soon(self._flush_registers)
        self._reg_batch.setdefault(topic, []).append(waiter)
        return waiter

    async def _asked_again(self, ask: Callable[[], Awaitable[T]], retries: str,
                           done: Callable[[], bool] | None = None) -> T | None:
        """``await ask()``, asked again after ``NATIVE_RETRY_S`` (counted ``retries``)
        while the appliance does not answer it in time (``NoAnswerError``: it is busy, e.g.
        with thousands of first publishes or subscribes at once), cannot take it yet
        (``BusyError``) or it cannot be asked while the native session is lost
        (``ConnectionLostError``), for ``NATIVE_WAIT_S`` at most; then that error is
        raised. ``done``: whether another request did it meanwhile (then None)."""
        loop = self.server.loop
        deadline = loop.time() + NATIVE_WAIT_S
        while True:
            try:
                return await ask()
            except (NoAnswerError, BusyError, ConnectionLostError):
                if self.closing or loop.time() + NATIVE_RETRY_S > deadline:
                    raise
                self.count(retries)
                await asyncio.sleep(NATIVE_RETRY_S)
                if done is not None and done():
                    return None

    def _flush_registers(self) -> None:
        """Send the topics gathered so far (at most ``REGISTER_BATCH_TOPICS``) as one batch;
        the others, and what comes meanwhile: the next."""
        if self._reg_running:
            return
        waiting = self._reg_batch
        if len(waiting) <= REGISTER_BATCH_TOPICS:
            batch, self._reg_batch = waiting, {}
        else:  # (the rest: the next batch, once this one is answered)
            topics = list(waiting)[:REGISTER_BATCH_TOPICS]
            batch = {t: waiting.pop(t) for t in topics}
        if batch:
            self._reg_running = True
            self.count("native_register_batches")
            self.server.spawn(self._run_registers(batch))

    async def _run_registers(self, batch: dict[str, list[asyncio.Future]]) -> None:
        topics = list(batch)
        cancelled: BaseException | None = None
        try:
            native = self.native
            if native is None:
                raise ClientError("the identity's native session is closed")
            results: list = await self.server.blocking(native.register_many, topics)
        except Exception as exc:  # (the whole request failed: every topic with it)
            results = [exc] * len(topics)
        except BaseException as exc:  # cancelled: the edge is stopping
            cancelled = exc
            results = [ClientError("the edge is stopping")] * len(topics)
        finally:
            self._reg_running = False
            if self._reg_batch:  # asked for while this batch ran: the next batch
                self.server.loop.call_soon(self._flush_registers)
        for topic, result in zip(topics, results):
            if result is None and len(self.registered) < REGISTERED_TOPICS:
                self.registered.add(topic)
            for waiter in batch[topic]:
                if waiter.done():  # (its publisher's connection was cancelled)
                    continue
                if result is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(result)
        if cancelled is not None:
            raise cancelled

    # --- subscriptions ---------------------------------------------------------------------
    async def hold(self, state: SessionState, key: str, match: str) -> None:
        """``state``'s filter ``key`` needs native pattern ``match``: subscribed natively
        unless the identity holds it already. Raises ``EntitlementError`` when P&M refuses
        it, ``ClientError`` when the appliance cannot take it."""
        while True:
            refs = self.refs.get(match)
            if refs is not None:
                refs.add((state, key))
                self.lingering.discard(match)
                self.count("native_subscribes_shared")
                await self._ended_meanwhile(state, key, match)
                return
            pending = self._pending.get(match)
            if pending is None:
                break
            await asyncio.wait([pending])  # another session's subscribe of it: its result
            if pending.exception() is not None:
                raise pending.exception()  # type: ignore[misc]
        fut = self.server.loop.create_future()
        self._pending[match] = fut
        try:
            guaranteed = await self._asked_again(lambda: self._subscribe_batched(match),
                                                 "native_subscribe_retries")
        except BaseException as exc:
            fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
            fut.exception()  # (retrieved: waiters read it, none may)
            raise
        finally:
            del self._pending[match]
        self._add(match, guaranteed, {(state, key)})
        fut.set_result(None)
        await self._ended_meanwhile(state, key, match)

    def keep(self, holder: Any, key: str, match: str, like: SessionState) -> bool:
        """``holder`` (shared_handoff.GroupTail: a member of this identity until its
        ``leave``) holds native pattern ``match`` under filter ``key`` as ``like`` does,
        with no native call, so the pattern stays when ``like`` releases it. False when
        ``like`` does not hold it, or the session is closing."""
        refs = self.refs.get(match)
        if self.closing or self.native is None or refs is None or (like, key) not in refs:
            return False
        refs.add((holder, key))
        self.members.add(holder)
        return True

    async def _ended_meanwhile(self, state: SessionState, key: str, match: str) -> None:
        """``state`` ended while its subscribe waited (its end released what it held
        then): what it took since is released too."""
        if state.ended:
            await self.release(state, key, match)

    def _add(self, match: str, guaranteed: bool, refs: set[Ref]) -> None:
        self.refs[match] = refs
        if "+" in match or "#" in match:
            self.wildcards.add(match)
        if guaranteed:
            self.guaranteed.add(match)
        else:
            self.guaranteed.discard(match)

    def _drop(self, match: str) -> set[Ref]:
        self.wildcards.discard(match)
        self.guaranteed.discard(match)
        self.lingering.discard(match)
        return self.refs.pop(match, set())

    def _subscribe_batched(self, match: str) -> asyncio.Future:
        """``_subscribe_all`` of ``match`` together with every other pattern asked for in the
        same wake-up of the event loop (one native ``subscribe_many`` per class for all of
        them: the appliance builds its tables once): its outcome, True with the guaranteed
        class, or what refused ``match`` alone."""
        loop = self.server.loop
        outcome = loop.create_future()
        if not self._sub_batch and not self._sub_running:
            loop.call_soon(self._flush_subscribes)
        self._sub_batch.append((match, outcome))
        return outcome

    def _flush_subscribes(self) -> None:
        """Send the patterns gathered so far as one batch; one batch at a time per
        identity (the appliance admits a SUBSCRIBE frame while the session has fewer than
        ``clients.max_pending_requests`` requests waiting): what comes meanwhile goes in
        the next."""
        if self._sub_running:
            return
        batch, self._sub_batch = self._sub_batch, []
        if batch:
            self._sub_running = True
            self.count("native_subscribe_batches")
            self.server.spawn(self._run_subscribes(batch))

    async def _run_subscribes(self, batch: list[tuple[str, asyncio.Future]]) -> None:
        try:
            async with self._gate.shared():
                results = await self.server.blocking(self._subscribe_all,
                                                     [m for m, _ in batch])
        except BaseException as exc:
            for _, outcome in batch:
                if not outcome.done():
                    outcome.set_exception(exc if isinstance(exc, Exception)
                                          else RuntimeError("cancelled"))
            return
        finally:
            self._sub_running = False
            if self._sub_batch:  # asked for while this batch ran: the next batch
                self.server.loop.call_soon(self._flush_subscribes)
        for (_, outcome), result in zip(batch, results):
            if outcome.done():  # (its subscribe was cancelled)
                continue
            if isinstance(result, BaseException):
                outcome.set_exception(result)
            else:
                outcome.set_result(result)

    def _subscribe_all(self, matches: list[str]) -> list[bool | Exception]:
        """Subscribe ``matches`` natively in both classes (best-effort, then guaranteed:
        MQTT QoS 1/2 and native guaranteed publications travel as guaranteed), each class in
        one native request (``Client.subscribe_many``) with ``own_class`` (each message
        comes once, in its class); a refused guaranteed class (no guaranteed place left at
        the appliance) is counted and the best-effort one kept, which then takes every
        message.
        Per pattern: True with the guaranteed class, False without, or the ``ClientError``
        that refused its best-effort class (``EntitlementError``: P&M), or that left its
        guaranteed class unanswered or not taken yet (``NoAnswerError``, ``BusyError``: the
        pattern is asked again, ``_asked_again``). Runs off the event loop."""
        native = self.native
        if native is None:
            raise ClientError("the identity's native session is closed")
        if not matches:
            return []
        # each class with own_class: a message comes once, in its class (a guaranteed one
        # over the reliable stream only, another best-effort only); with the guaranteed
        # class refused, everything comes best-effort (the appliance leaves out only what
        # the session's guaranteed subscriptions take)
        first = native.subscribe_many(matches, callback=self.on_native,
                                      own_class=True)  # P&M's decision
        out: list[bool | Exception] = [r if isinstance(r, ClientError) else True
                                       for r in first]
        allowed = [m for m, r in zip(matches, out) if r is True]
        self.native_subscribes += len(allowed)
        # allowed by now: a refusal here is the appliance's guaranteed places, not P&M
        second = iter(native.subscribe_many(allowed, qos="guaranteed", own_class=True,
                                            callback=self.on_native) if allowed else ())
        for i, r in enumerate(out):
            if r is True:
                r = next(second)
                if isinstance(r, (NoAnswerError, BusyError)):
                    out[i] = r
                elif isinstance(r, ClientError):
                    self.count("subscriptions_guaranteed_refused")
                    out[i] = False
                else:
                    self.native_subscribes += 1
        return out

    async def release(self, state: SessionState, key: str, match: str) -> None:
        """``state`` no longer holds filter ``key``: the native pattern goes when no session
        of the identity holds it (module docstring: at once, or lingering)."""
        refs = self.refs.get(match)
        if refs is None:
            return
        refs.discard((state, key))
        if refs or self.closing:
            return
        if len(self.refs) > EAGER_UNSUBSCRIBE_PATTERNS:
            self.lingering.add(match)
            self.count("native_patterns_lingering")
            if len(self.lingering) > len(self.refs) - len(self.lingering):
                await self._rebuild()
            return
        await self._unsubscribe_batched(match)

    async def _unsubscribe_batched(self, match: str) -> None:
        """Withdraw ``match`` natively together with every other pattern released in the
        same wake-up of the event loop (one native ``unsubscribe_many``), unless held again
        by then."""
        loop = self.server.loop
        if self._unsub_batch is None:
            self._unsub_batch = ([], loop.create_future())
            loop.call_soon(lambda: self.server.spawn(self._run_unsubscribes()))
        self._unsub_batch[0].append(match)
        await asyncio.shield(self._unsub_batch[1])

    async def _run_unsubscribes(self) -> None:
        if self._unsub_batch is None:
            return
        matches, done = self._unsub_batch
        self._unsub_batch = None
        try:
            async with self._gate.alone():
                gone = [m for m in dict.fromkeys(matches) if not self.refs.get(m)]
                if gone and not self.closing and self.native is not None:
                    for match in gone:  # (the others were held again meanwhile)
                        self._drop(match)
                    self.count("native_unsubscribe_batches")
                    await self._withdraw(gone, rebuild=False)
        except BaseException as exc:
            if self.closing and isinstance(exc, ClientError):
                done.set_result(None)  # the native session went with its last member
                return
            done.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
            done.exception()  # (retrieved: the releases waiting read it)
            return
        done.set_result(None)

    async def _rebuild(self) -> None:
        """Withdraw every lingering pattern: the native list is made again from the live
        ones."""
        async with self._gate.alone():
            if self.closing or self.native is None or not self.lingering:
                return
            for match in list(self.lingering):
                if not self.refs.get(match):
                    self._drop(match)
            self.lingering.clear()
            self.count("native_rebuilds")
            try:
                await self._withdraw(["#"], rebuild=True)
            except ClientError:
                if not self.closing:
                    raise  # (closing: the native session went with its last member)

    async def _withdraw(self, matches: list[str], rebuild: bool) -> None:
        """Withdraw ``matches`` natively in one request (seed 000: also what they include)
        and subscribe again, in one request, the held patterns they may have taken; a held
        pattern P&M now refuses is taken from its sessions. Asked again, both steps, while
        unanswered (``_asked_again``)."""
        from datapath.topics.algebra import overlaps

        if not rebuild and self.native_subscribes > NATIVE_RESUBSCRIBE_FACTOR * max(
                1, len(self.refs)):
            rebuild = True
            self.count("native_rebuilds")
        again = list(self.refs) if rebuild else [
            p for p in self.refs if any(overlaps(p, m) for m in matches)]
        native = self.native

        def work() -> dict[str, bool | None]:
            if rebuild:
                native.unsubscribe("#")
                self.native_subscribes = 0
            else:
                for error in native.unsubscribe_many(matches):
                    if error is not None:
                        raise error
                # their subscriptions (one per class) went: only the subscribes again of
                # the patterns they overlap add up towards a rebuild (a rebuild withdraws
                # every pattern before subscribing the held ones again: a gap in delivery
                # for the identity's other sessions)
                self.native_subscribes = max(0, self.native_subscribes - 2 * len(matches))
            out: dict[str, bool | None] = {}
            failed: ClientError | None = None
            for pattern, result in zip(again, self._subscribe_all(again)):
                if isinstance(result, EntitlementError):  # P&M took it back meanwhile
                    out[pattern] = None
                elif isinstance(result, ClientError):
                    failed = failed or result
                else:
                    out[pattern] = result
            if failed is not None:
                raise failed
            return out

        done = await self._asked_again(lambda: self.server.blocking(work),
                                       "native_unsubscribe_retries")
        for pattern, guaranteed in (done or {}).items():
            if guaranteed is None:
                for state, key in self._drop(pattern):
                    state.filters.pop(key, None)
                    self.count("subscriptions_withdrawn")
            elif pattern in self.refs:
                self._add(pattern, guaranteed, self.refs[pattern])

    # --- from the fabric -------------------------------------------------------------------
    def on_native(self, msg: Any) -> None:
        """A native message for one of the identity's patterns (client thread). The native
        client calls this once per matching subscription: only the first counts."""
        if msg is self._last_native:
            return
        self._last_native = msg
        with self._queued_lock:
            if self._queued >= min(NATIVE_PENDING_MESSAGES * max(1, len(self.members)),
                                   NATIVE_PENDING_MAX):
                self.server.count("deliveries_dropped_backlog")
                return
            self._queued += 1
            inbox = self._inbox
            inbox.append(msg)
            if len(inbox) > 1:  # its call on the loop is due already
                return
        try:
            self.server.loop.call_soon_threadsafe(self._take_inbox)
        except RuntimeError:  # the server's loop has stopped: the edge is going down
            self.server.count("deliveries_dropped_stopping")

    def _take_inbox(self) -> None:
        """The messages the client thread handed over since the last call (on the loop)."""
        with self._queued_lock:
            batch, self._inbox = self._inbox, []
        for msg in batch:
            self._from_fabric(msg)

    def matching(self, topic: str) -> list[str]:
        """The held patterns ``topic`` matches (MQTT's rules, the ``$`` rule too)."""
        out = [topic] if topic in self.refs else []
        out.extend(p for p in self.wildcards if mqtt_matches(p, topic))
        return out

    def _from_fabric(self, msg: Any) -> None:
        with self._queued_lock:
            self._queued -= 1
        if self.closing:
            return
        patterns = self.matching(msg.topic)
        # each pattern is subscribed in both native classes with own_class, so a guaranteed
        # message comes over the reliable stream only; a best-effort copy of one (which
        # the appliance leaves out: never, unless it did not) is dropped and counted
        if (not msg.guaranteed and msg.qos == GUARANTEED_QOS
                and any(p in self.guaranteed for p in patterns)):
            self.count("deliveries_guaranteed_copies")
            return
        by_session: dict[SessionState, list[str]] = {}
        for pattern in patterns:
            for state, key in self.refs[pattern]:
                by_session.setdefault(state, []).append(key)
        if not by_session:
            self.count("deliveries_unmatched")  # the $ rule, or a lingering pattern
            return
        sender = 0
        native = self.native
        if native is not None and msg.origin == self.server.node_id and (
                msg.stream & ~RELIABLE_STREAM_BIT) == native.session:
            value = msg.headers.get(SENDER_HEADER) if msg.headers else None
            if value is not None:
                try:
                    sender = int(value)
                except ValueError:
                    sender = 0
        meta, published_qos = from_headers(msg.headers, self.count)  # (meta.py)
        if published_qos == 2 and meta is not None and meta.origin and (
                self.server.delivered_once.seen_before((self.identity, msg.origin,
                                                        meta.origin))):
            self.count("deliveries_duplicates_dropped")  # published again (exactly_once.py)
            return
        if meta is not None and meta.origin and msg.origin != self.server.node_id:
            meta = replace(meta, origin=0)  # another edge's number: its state store's only
        groups: set[str] = set()
        for state, keys in by_session.items():
            state.from_fabric(msg, keys, meta, published_qos, sender, groups)
