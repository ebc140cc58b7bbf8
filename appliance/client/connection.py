"""Where a client stands with its appliance: liveness, the connection states, reconnection
(``ConnectionSide``, one part of ``Client``).

Liveness. Everything the appliance sends counts as a sign of life. A client that has heard
nothing for a while asks (``LIVENESS_PROBES_PER_TIMEOUT`` times per session timeout, at most
``LIVENESS_PROBE_MAX_INTERVAL_NS`` apart) with a repeat of its login, which the appliance
answers with the session it made (docs/appliance.md, "Clients"; counted there as
``control_login_repeats``). Silence for the session timeout, an answer naming another session
or refusing (the appliance restarted and no longer knows it), a LOGOUT, or a channel that
failed for good: the connection is **lost**.

States (``StateChange.state``, given to ``connect(..., on_state=)``): ``connected`` ->
``lost`` -> ``reconnecting`` (each attempt) -> ``reconnected`` (then connected again) or
``closed`` (gave up, or ``close()``). On ``lost`` the client fails the outcomes of its
unacknowledged guaranteed messages (reason ``appliance lost``; with ``connect(...,
resend=True)`` it keeps them instead and sends them again, in order, on the new session
before anything newer: at least once, as the lost appliance may have passed some on before
it acknowledged them), gives each guaranteed
subscription a ``Loss`` event (reason ``SESSION_LOST``, count unknown: what was published
while it was away is not delivered to it), and raises ``ConnectionLostError`` from the next
call. Reconnection runs on a thread of its own: capped, jittered exponential backoff; per
attempt a fresh channel where the transport needs one (shared memory, RDMA), the login, the
topics registered again and the subscriptions made again (the client's lists replayed), until
``reconnect_s`` has passed. A client with a standby (``connect(..., standby=)``) tries the
other appliance first and then alternates: a move (``moves``) is a reconnection whose reason
says ``moved to URL``; its login names the session it leaves (``moved_from``), so the
standby logs the move and tells the appliance it left (SESSION_MOVE, when they are
neighbours).
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from appliance.client.errors import ClientError, ConnectionLostError, NoAnswerError
from appliance.client.messages import QOS, Loss
from appliance.client.outcomes import REASON_LOST, REASON_REFUSED, describe
from appliance.client.settings import (
    LIVENESS_PROBE_MAX_INTERVAL_NS,
    LIVENESS_PROBES_PER_TIMEOUT,
    RECONNECT_BACKOFF_FIRST_S,
    RECONNECT_BACKOFF_MAX_S,
    RECONNECT_JITTER_FRACTION,
    RECONNECT_LOGIN_TIMEOUT_S,
)
from datapath.errors import TopicwireError
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.extensions import split as split_extensions

if TYPE_CHECKING:
    from appliance.client.api import Client

log = logging.getLogger("topicwire.client")

CONNECTED = "connected"
LOST = "lost"
RECONNECTING = "reconnecting"
RECONNECTED = "reconnected"
CLOSED = "closed"
STATES = (CONNECTED, LOST, RECONNECTING, RECONNECTED, CLOSED)
AGAIN_PER_TIMEOUT = 512
"""(Un)subscribes a reconnection makes again per ``RECONNECT_LOGIN_TIMEOUT_S`` of its
batched request's deadline."""
SESSION_LOST = "SESSION_LOST"
"""``Loss.reason`` given to guaranteed subscriptions when the connection is lost."""
_KICKED = "disconnected by management"
"""A LOGOUT with this reason ends the client: an operator ended the session on purpose."""


@dataclass(frozen=True, slots=True)
class StateChange:
    """One change of a client's connection state."""

    state: str
    """``connected``, ``lost``, ``reconnecting``, ``reconnected`` or ``closed``."""
    reason: str
    """Why (the loss, the last attempt's failure, the give-up), or ``""``."""
    attempt: int = 0
    """Reconnection attempts so far in this outage (``reconnecting``, ``reconnected``)."""
    failed: int = 0
    """Guaranteed messages whose outcomes failed with the change (``lost``, ``closed``)."""
    at_ns: int = 0
    """Wall clock of the change."""
    appliance: str = ""
    """The appliance the client is connected to after the change (``reconnected``): the
    other one after a move to the standby."""


class ConnectionSide:
    """The connection state of a ``Client`` (which inherits it); its methods use the
    client's state and lock."""

    # --- states --------------------------------------------------------------------------------
    def _emit(self: Client, state: str, reason: str = "", attempt: int = 0,
              failed: int = 0) -> None:
        change = StateChange(state, reason, attempt, failed, time.time_ns(), self.url)
        self.state_changes += 1
        self.last_state = change
        callback = self._on_state
        if callback is not None:
            try:
                callback(change)
            except Exception:  # an application's callback must not end the client's thread
                log.exception("client %s: the on_state callback raised", self.identity)

    def _check_usable(self: Client) -> None:
        """Raise what a call must see: closed, a loss not reported yet, not connected."""
        if self.closed and self.state != CLOSED:
            raise ClientError("the client is closed; connect again")
        notice = self._loss_notice
        if notice is not None:
            self._loss_notice = None
            state = self.state
            if state == CONNECTED:
                what = ("best-effort messages published meanwhile were not delivered; the "
                        "guaranteed ones were sent again") if self.resend else (
                        "messages published meanwhile were not delivered")
                raise ConnectionLostError(f"{notice}; reconnected since ({what})", state=state)
            raise ConnectionLostError(f"{notice}; {self._where()}", state=state)
        if self.state != CONNECTED:
            raise ConnectionLostError(f"not connected to the appliance: {self._where()}",
                                      state=self.state)

    def _where(self: Client) -> str:
        state = self.state
        if state == CLOSED:
            why = self.logged_out_reason or "closed"
            return f"the client is closed ({why}); connect again"
        return f"{state}, reconnecting for up to {self.reconnect_s:g} s"

    # --- liveness (the client thread) ------------------------------------------------------------
    def _probe_interval_ns(self: Client) -> int:
        return min(LIVENESS_PROBE_MAX_INTERVAL_NS,
                   int(self.session_timeout_s * 1e9) // LIVENESS_PROBES_PER_TIMEOUT)

    def _liveness(self: Client, now_ns: int) -> int:
        """Probe a silent appliance; declare it lost after the session timeout."""
        if self.state != CONNECTED or not self.session or self.closed:
            return 0
        interval = self._probe_interval_ns()
        timeout_ns = int(self.session_timeout_s * 1e9)
        if now_ns - self._liveness_ns > interval:
            # this thread itself did not run for a while (the process stopped, the host or
            # the application's threads busy): what the appliance sent meanwhile may still
            # wait unread, so its silence counts from half a timeout ago at most
            self._heard_ns = max(self._heard_ns, now_ns - timeout_ns // 2)
        self._liveness_ns = now_ns
        silent_ns = now_ns - self._heard_ns
        if silent_ns > timeout_ns:
            self._lost(f"no answer from the appliance for {self.session_timeout_s:g} s")
            return 1
        path = self._path
        if path is not None:
            number = path.probe_due(now_ns)
            if number:
                try:
                    self._send_login(self._token, {"probe": number})
                except ClientError:
                    pass  # the channel is gone: the timeout (or the channel's failure) says so
            verdict = path.verdict(now_ns)
            if verdict is not None:
                self._lost_why = verdict[0]
                self._lost(verdict[1])
                return 1
            if number:
                return 1
        if silent_ns >= interval and now_ns >= self._probe_at_ns:
            self._probe_at_ns = now_ns + interval
            self.probes += 1
            try:
                self._send_login(self._token)
            except ClientError:
                pass  # the channel is gone: the timeout (or the channel's failure) says so
            return 1
        return 0

    def _on_login_answer(self: Client, doc: dict) -> None:
        """A LOGIN_RESULT nobody waits for: the answer to a liveness probe."""
        if self.state != CONNECTED or not self.session:
            return
        if self._path is not None and "probe" in doc:
            self._path.on_answer(int(doc["probe"]), time.monotonic_ns())
        if not doc.get("accepted"):
            self._lost_why = "refused"
            self._lost(f"the appliance refused this session ({doc.get('reason')})")
        elif int(doc.get("session", 0)) != self.session:
            self._lost_why = "refused"
            self._lost("the appliance no longer knows this session (it restarted)")

    def _on_logout(self: Client, reason: str, move: bool = False) -> None:
        """A LOGOUT from the appliance. With ``move`` it asks this session to move to the
        standby (an operator's ``move_clients``: the client said at login it has one)."""
        self.logged_out_reason = reason
        self._lost_why = "asked" if move and len(self.targets) > 1 else "logout"
        if reason == _KICKED or self.reconnect_s <= 0:
            self._lost(f"logged out by the appliance: {reason}", reconnect=False)
        else:
            self._lost(f"logged out by the appliance: {reason}")

    # --- losing and regaining the connection ------------------------------------------------------
    def _lost(self: Client, reason: str, *, reconnect: bool = True) -> None:
        """The session is gone: fail what it carried, tell the application, reconnect."""
        with self._lock:
            if self.state != CONNECTED or self.closed:
                return
            self.state = LOST
            self._lost_session = (self.session, self.node_id)
            self._move_why, self._lost_why = self._lost_why, "silence"
            self.session = 0
            if not self.logged_out_reason:
                self.logged_out_reason = f"connection lost: {reason}"
            self.losses_of_connection += 1
            self._loss_notice = f"the connection to the appliance was lost: {reason}"
            self._gsender = None
            self._greceiver = None
            with self._pub_lock:
                self._open_since_ns = 0  # an open best-effort frame goes with the session
        if self.resend and reconnect and self.reconnect_s > 0:
            with self._lock:  # sent again, in order, once the client is connected again
                self._to_resend.extend(self._outcomes.detach_pending())
            failed = 0
        else:
            failed = self._outcomes.fail_all(f"{REASON_LOST} ({reason})")
        log.warning("client %s: connection to %s lost: %s%s", self.identity, self.url, reason,
                    f"; {failed} guaranteed messages not acknowledged" if failed else "")
        self._emit(LOST, reason, failed=failed)
        self._lost_at_ns = time.time_ns()
        if len(self.targets) > 1:  # a move may fill the gap from the cache: told after it
            self._session_lost_pending = True
        else:
            self._session_lost()
        if reconnect and self.reconnect_s > 0 and not self.closed:
            thread = threading.Thread(target=self._reconnect, args=(reason,), daemon=True,
                                      name=f"client-{self.identity}-reconnect")
            thread.start()
            self._reconnector = thread  # (started: close() may join it)
        else:
            self._give_up(reason)

    def _session_lost(self: Client, subs: list | None = None) -> None:
        """The ``SESSION_LOST`` event, to ``subs`` (default: every guaranteed subscription)."""
        loss = Loss(0, 0, 0, 0, 0, SESSION_LOST, 0, time.time_ns())
        if subs is not None:
            for sub in subs:
                sub._loss(loss)
            self.losses += 1
        elif self._held:  # after the messages received before the loss (topics unknown)
            next(reversed(self._held.values())).append(loss)
        else:
            self._deliver_guaranteed(loss)

    def _give_up(self: Client, reason: str) -> None:
        with self._lock:
            self.state = CLOSED
            if not self.logged_out_reason:
                self.logged_out_reason = reason
            held, self._to_resend = self._to_resend, []
        self._outcomes.fail_detached(held, f"{REASON_LOST} ({reason})")
        if getattr(self, "_session_lost_pending", False):
            self._session_lost_pending = False
            self._session_lost()
        for sub in list(self._subs):
            if sub._seen is not None:  # live messages a failed attempt held
                sub._end_fill()
            sub._close()
        self._emit(CLOSED, reason)

    def _reconnect(self: Client, reason: str) -> None:
        """The reconnection thread: attempts with capped, jittered backoff."""
        deadline = time.monotonic() + self.reconnect_s
        backoff = RECONNECT_BACKOFF_FIRST_S
        attempt = 0
        last = reason
        while not self.closed:
            attempt += 1
            self.state = RECONNECTING
            self._emit(RECONNECTING, last, attempt)
            try:
                moved = self._reattach(attempt)
            except Exception as exc:  # any failure of an attempt is the next attempt's reason
                last = str(exc)
                log.info("client %s: reconnection attempt %d failed: %s", self.identity,
                         attempt, last)
            else:
                if self.closed:
                    return
                self.reconnects += 1
                with self._lock:
                    self._heard_ns = time.monotonic_ns()
                    self.logged_out_reason = None
                    if self._path is not None:  # measured anew; no move for a hold-down
                        self._path.restart(self._heard_ns)
                    self.state = CONNECTED
                if moved:
                    why = self._move_why
                    self.moves_by_reason[why] = self.moves_by_reason.get(why, 0) + 1
                    log.warning("client %s: session moved to %s, session %d (attempt %d; "
                                "%s)", self.identity, self.url, self.session, attempt, reason)
                    self._emit(RECONNECTED, f"moved to {self.url}: {reason}", attempt)
                else:
                    log.warning("client %s: reconnected to %s (attempt %d, session %d)",
                                self.identity, self.url, attempt, self.session)
                    self._emit(RECONNECTED, reason, attempt)
                return
            wait = backoff * (1 - RECONNECT_JITTER_FRACTION * random.random())
            if time.monotonic() + wait > deadline:
                break
            if self._closing.wait(wait):
                return
            backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX_S)
        if not self.closed:
            why = (f"gave up reconnecting to {self.url} after {attempt} attempts in "
                   f"{self.reconnect_s:g} s ({last})")
            log.warning("client %s: %s", self.identity, why)
            self._loss_notice = f"the connection to the appliance was lost: {reason}"
            self._give_up(why)

    def _reattach(self: Client, attempt: int = 1) -> bool:
        """One attempt: a channel, the login, the topics, the subscriptions; True when the
        session moved to the other appliance. With a standby the first attempt goes to the
        other appliance, then they alternate."""
        index = self.target_index
        if len(self.targets) > 1:
            index = (self.target_index + attempt) % len(self.targets)
        target = self.targets[index] if self.targets else None
        moved = index != self.target_index
        if target is not None and (target.reopen or moved):
            channel, ring = target.open()
            with self._lock, self._pub_lock:
                old, self.channel = self.channel, channel
                self._ring = ring
            old.close()
        fills = [sub for sub in self._subs if sub._seen is not None]
        for sub in fills:  # live messages wait until the replay has filled the gap: from the
            sub._begin_fill()  # login on (a session the standby's mirror restores is live then)
        session, node_id = getattr(self, "_lost_session", (0, 0))
        self._moved_from = {"node_id": node_id, "session": session,
                            "why": self._move_why} if (moved and session and node_id) else None
        try:
            self._login(self._ring, timeout_s=min(self.timeout_s, RECONNECT_LOGIN_TIMEOUT_S))
        finally:
            self._moved_from = None
        if moved:
            self.target_index = index
            self.url = target.url
            self.moves += 1
        with self._lock:
            self._heard_ns = time.monotonic_ns()
        self._register_again()  # (a failed attempt leaves the fills begun: held until one fills)
        try:
            self._subscribe_again()
        finally:
            self._fill_gap(fills)
            with self._lock:  # (the appliance may have given a subscription another policy)
                self._subs_changed()
        self._send_again()
        self._wake_durables()
        return moved

    def _wake_durables(self: Client) -> None:
        """The durable subscriptions' pagers stop waiting for the answer to a request the
        lost session sent (it will not come) and ask the appliance they are connected to
        now, from where they are (appliance/client/durable.py), at once instead of after
        the request's timeout."""
        for sub in list(getattr(self, "_durables", ())):
            fetcher = sub._fetcher
            if fetcher is None or not fetcher.thread.is_alive():
                continue  # (its first request: subscribe's own, answered or timed out)
            key = fetcher.waiting
            with self._lock:
                waiter = self._waiters.get(key) if key is not None else None
            if waiter is not None and waiter.result is None:
                self.durables_woken += 1
                waiter.event.set()

    def _fill_gap(self: Client, subs: list) -> None:
        """After a move (or a reconnection) of a client with a standby: what each guaranteed
        subscription missed meanwhile, from the appliance's cache (a replay from
        ``FAILOVER_LOOKBACK_S`` before the latest message each publisher had handed over,
        or before the silence began: ``Subscription._fill_from_ns``),
        joined to the live stream without a gap or a duplicate (the messages' identities;
        the cache is asked again until it has kept the first live message held of each
        publisher, at most ``JOIN_TIMEOUT_S``: it may lag behind the live stream); a
        subscription whose pattern the cache does not keep gets the
        ``SESSION_LOST`` event instead, as without a standby."""
        from appliance.client.replay import JOIN_POLL_S, JOIN_TIMEOUT_S, _page, _pages

        pending = getattr(self, "_session_lost_pending", False)
        self._session_lost_pending = False
        silent_since = getattr(self, "_lost_at_ns", time.time_ns()) - int(
            self.session_timeout_s * 1e9)
        unfilled = []
        for sub in subs:
            try:
                last = [0]
                page = _page(self, sub.pattern, sub.namespace,
                             {"from_time_ns": sub._fill_from_ns(silent_since)})
                for msg in _pages(self, sub.pattern, sub.namespace, page, last):
                    sub._fill(msg)
                    self.filled += 1
                deadline = time.monotonic() + JOIN_TIMEOUT_S
                while not sub._joined() and time.monotonic() < deadline:
                    time.sleep(JOIN_POLL_S)  # the cache appends what it received meanwhile
                    self.fill_polls += 1
                    page = _page(self, sub.pattern, sub.namespace, {"from_seq": last[0]})
                    for msg in _pages(self, sub.pattern, sub.namespace, page, last):
                        sub._fill(msg)
                        self.filled += 1
            except TopicwireError as exc:  # no cache for it, refused, no answer: a loss
                log.warning("client %s: the gap of %r since the connection was lost cannot "
                            "be filled from %s (%s): a SESSION_LOST event", self.identity,
                            sub.pattern, self.url, exc)
                unfilled.append(sub)
            finally:
                sub._end_fill()
        if pending and unfilled:
            self._session_lost(unfilled)

    def _send_again(self: Client) -> None:
        """``resend=True``: the guaranteed messages the lost session did not acknowledge go
        on the new session's stream, in their order, before anything published after."""
        with self._lock:
            held, self._to_resend = self._to_resend, []
        names = {key: nt for nt, key in self._keys.items()}
        for i, outcome in enumerate(held):
            key, payload, ts, namespace, schema, flags = outcome._message or (
                0, b"", 0, 0, 0, 0)
            if key not in names:  # P&M no longer lets this client publish to the topic
                self._outcomes.fail_detached([outcome], f"{REASON_REFUSED} (topic "
                                             f"{outcome.topic!r} refused on reconnection)")
                continue
            try:
                if outcome.first_sequence is not None:  # a large message: all its segments
                    body = split_extensions(payload, flags)[0]
                    self._publish_segmented(key, outcome.topic, body, payload[len(body):], ts,
                                            namespace, schema, False, None, outcome)
                else:
                    self._publish_guaranteed(key, outcome.topic, payload, ts, namespace,
                                             schema, False, None, outcome, flags)
            except ClientError as exc:
                self._outcomes.fail_detached(held[i:], f"{REASON_LOST} (not sent again: "
                                             f"{exc})")
                break
        self.resent += len(held)
        if held:
            with self._lock:
                if self._gsender is not None:
                    self._gsender.flush(time.monotonic_ns())
            with self._outcomes._cond:  # a flush waiting for them looks again
                self._outcomes._cond.notify_all()

    def _register_again(self: Client) -> None:
        """Register the topics this client published to again (those P&M now refuses are
        forgotten: the next publish to one raises ``EntitlementError``)."""
        held = list(self._keys.items())
        if not held:
            return
        # one batched request (Client.register_many's), not a round trip per topic
        answers = self._register_entries([al.RegistryEntry(k, n, t) for (n, t), k in held],
                                         RECONNECT_LOGIN_TIMEOUT_S)
        for ((namespace, topic), _), result in zip(held, answers):
            if result is None:
                raise NoAnswerError(f"no answer from the appliance to the registration of "
                                    f"{topic!r} on reconnection")
            if not result.get("accepted"):
                log.warning("client %s: topic %r refused on reconnection: %s", self.identity,
                            topic, result.get("reason"))
                self._keys.pop((namespace, topic), None)

    def _subscribe_again(self: Client) -> None:
        """Make the subscriptions again: first those the client's lists absorbed (a broader
        entry includes them), then each list's entries in order (positive entries with the
        QoS of their subscriptions, negative ones as unsubscribes), as they were made. A run
        of subscribes (or of unsubscribes) goes in one batched request, runs in order."""
        with self._lock:
            subs = list(self._subs)
            lists = {ns: lst.entries for ns, lst in self._lists.items()}
        by_pattern: dict[tuple[int, str], list] = {}
        for sub in subs:
            by_pattern.setdefault((sub.namespace, sub.pattern), []).append(sub)
        listed = {(ns, e.pattern) for ns, entries in lists.items() for e in entries if e.positive}
        plan: list[tuple[bool, int, str, int]] = []  # (subscribe, namespace, pattern, qos)
        for sub in subs:
            if (sub.namespace, sub.pattern) not in listed:
                plan.append((True, sub.namespace, sub.pattern, QOS[sub.qos]))
        for ns, entries in lists.items():
            for entry in entries:
                if not entry.positive:
                    plan.append((False, ns, entry.pattern, 0))
                    continue
                qoses = {QOS[s.qos] for s in by_pattern.get((ns, entry.pattern), ())}
                for qos in sorted(qoses or {0}):
                    plan.append((True, ns, entry.pattern, qos))
        restored, self._restored = self._restored, set()
        if restored:  # made by the appliance from the standby's mirror (control/mirror.py)
            wanted = {(ns, p, q) for add, ns, p, q in plan if add}
            # what the mirror made that the client no longer has (a change it had not sent):
            # unsubscribed first (both classes), and its pattern's wanted ones made again
            extra = sorted({(ns, p) for ns, p, q in restored - wanted})
            kept = [(add, ns, p, q) for add, ns, p, q in plan
                    if not (add and (ns, p, q) in restored and (ns, p) not in extra and all(
                        s.selector is None for s in by_pattern.get((ns, p), ())
                        if QOS[s.qos] == q))]
            found = len(plan) - len(kept)
            self.restored_subscriptions += found
            plan = [(False, ns, p, 0) for ns, p in extra] + kept
            log.info("client %s: %d subscriptions found made at %s (the standby's mirror)",
                     self.identity, found, self.url)
        items: list[tuple[bool, int, str, int, str, list]] = []
        for subscribe, ns, pattern, qos in plan:
            # the selectors go again too (docs/selectors.md, "In the fabric"): a plain entry
            # when a subscription of it has none (or none was made with exactly it), one
            # entry per distinct selector text
            same = [s for s in by_pattern.get((ns, pattern), ()) if QOS[s.qos] == qos] \
                if subscribe else []
            texts = sorted({s.selector.text for s in same if s.selector is not None})
            plain = not same or any(s.selector is None for s in same)
            for text in ([""] if plain else []) + texts:
                items.append((subscribe, ns, pattern, qos, text, same))
        for _, run in itertools.groupby(items, key=lambda item: item[0]):
            self._make_again(list(run), by_pattern)

    def _make_again(self: Client, items: list[tuple[bool, int, str, int, str, list]],
                    by_pattern: dict[tuple[int, str], list]) -> None:
        """A run of (un)subscribes of ``_subscribe_again`` in one batched request; a
        subscription whose selector the appliance filters again is told so, one refused is
        closed. ``NoAnswerError`` when some went unanswered (the attempt fails)."""
        subscribe = items[0][0]
        ids = [next(self._sub_ids) for _ in items]
        request = "subscribe" if subscribe else "unsubscribe"
        entries = []
        for sub_id, (_, ns, pattern, qos, text, same) in zip(ids, items):
            flags = max((s.flow_flags for s in same), default=0)  # (the policy asked for)
            if same and all(s.own_class for s in same):  # (Client._own_flags)
                flags |= al.SUBSCRIPTION_FLAG_OWN_CLASS
            entries.append(al.Subscription(sub_id, ns, qos, flags, pattern, text))
        answers = self._request_frames(
            [(request, i) for i in ids], entries,
            fl.FrameType.SUBSCRIBE if subscribe else fl.FrameType.UNSUBSCRIBE,
            RECONNECT_LOGIN_TIMEOUT_S * (1 + len(items) // AGAIN_PER_TIMEOUT))
        for (_, ns, pattern, _, text, same), result in zip(items, answers):
            if result is None:
                raise NoAnswerError(f"no answer from the appliance to the {request} of "
                                    f"{pattern!r} on reconnection; is it running?")
            mine = [s for s in same if s.selector is not None and s.selector.text == text]
            if result.get("accepted"):
                for sub in same:
                    sub.flow_policy = result.get("flow_policy")
                    sub.own_class_applied = sub.own_class and bool(result.get("own_class"))
                for sub in mine:
                    sub.selector_filtered = bool(result.get("selector_filtered"))
                continue
            log.warning("client %s: %s %r refused on reconnection: %s", self.identity, request,
                        pattern, result.get("reason"))
            if subscribe:
                for sub in mine if text else by_pattern.get((ns, pattern), ()):
                    sub._close()

    # --- reporting --------------------------------------------------------------------------------
    def path_counters(self: Client) -> dict[str, Any] | None:
        """With ``move_on``: the path's figures over the current window (``latency_ms``
        median, ``jitter_ms``, ``loss_ratio``, ``samples``) and the probes (``sent``,
        ``answered``, ``lost``, ``late``); else None."""
        path = self._path
        if path is None:
            return None
        fig = path.figures(time.monotonic_ns())
        return {"latency_ms": fig.latency_ms, "jitter_ms": fig.jitter_ms,
                "loss_ratio": fig.loss_ratio, "samples": fig.samples,
                "window_s": path.bounds.window_s, "sent": path.sent,
                "answered": path.answered, "lost": path.lost, "late": path.late}

    def connection_counters(self: Client) -> dict[str, Any]:
        """The client's connection state and counters (``state``, ``losses``,
        ``reconnects``, ``probes``, guaranteed outcomes, and the publish frames that waited for
        or were dropped by a channel that pushed back)."""
        return {"state": self.state, "session": self.session, "losses": self.losses_of_connection,
                "reconnects": self.reconnects, "probes": self.probes,
                "appliance": self.url, "moves": self.moves,
                "restored_subscriptions": self.restored_subscriptions,
                "moves_by_reason": dict(self.moves_by_reason), "path": self.path_counters(),
                "move_on": self.move_on_source,
                "acknowledged": self._outcomes.acknowledged, "failed": self._outcomes.failed,
                "unacknowledged": self._outcomes.unacknowledged(),
                "send_waits": self.send_waits, "send_drops": self.send_drops,
                "messages_dropped_at_send": self.messages_dropped_at_send,
                "republished_dropped": self._republished.dropped}


def unacknowledged_text(failed: dict[str, int], pending: int, timeout_s: float | None) -> str:
    """The sentence of ``UnacknowledgedError`` and ``close``'s warning."""
    parts = []
    if failed:
        parts.append(f"{sum(failed.values())} failed ({describe(failed)})")
    if pending:
        wait = f" after {timeout_s:g} s" if timeout_s else ""
        parts.append(f"{pending} still unacknowledged{wait}")
    return "; ".join(parts)

