"""The data-path agent's delivery: running the software NIC over a burst, delivering its
results to local sessions and destinations (framing per egress), software NIC digests, and
messages parked on a key the tables do not know yet (rerun on a new snapshot, expired)
(``Delivery``, one part of ``DataPlaneAgent``)."""

from __future__ import annotations

import functools
import time
from collections import deque
from typing import Any

import numpy as np

from appliance.config import ACL_LOG_LINES_PER_S, PARKED_MESSAGES
from appliance.control import route_apply
from appliance.dataplane import express as _express
from appliance.dataplane.names import FABRIC
from appliance.dataplane.state import (
    _DATA,
    _DIGEST_NAMES,
    _DIGEST_UNKNOWN_KEY,
    _FEW,
    _GROUP,
    _HEADER,
    _UNKNOWN,
    OWN_GUARANTEED,
    OWN_PLAIN,
    UNKNOWN_KEYS_KEPT,
    DpSession,
    log,
)
from channels.base import FrameBatch
from datapath.protocol import frame_layout as fl
from datapath.protocol import message_layout as ml
from datapath.protocol.extensions import EXTENSION_FLAGS, ExtensionError
from datapath.protocol.extensions import split as split_extensions
from nic_offload.errors import OffloadUserError
from nic_offload.model import AclAction
from nic_offload.selectors import HEADER_PROPERTIES, compile_selector, message_event
from nic_offload.selectors.events import HEADER_PREFIX
from nic_offload.selectors.values import normalize
from nic_offload.softnic import ingress_acl

_ACL_ACCEPT, _ACL_LOG = int(AclAction.ACCEPT), int(AclAction.LOG)
_ACL_OUTCOME = {_ACL_ACCEPT: "accepted", int(AclAction.REJECT): "rejected", _ACL_LOG: "logged",
                ingress_acl.SHORT_PAYLOAD: "short_payload"}
"""Ingress verdicts -> the outcome in their counters' names (``content_acl_<outcome>``,
``content_acl_<outcome>_class_<name>``)."""


_GUARANTEED_QOS = int(ml.Qos.GUARANTEED)
"""A message's ``qos`` when it was published guaranteed (its class)."""

_UNEVALUATED = object()
"""A message the appliance cannot evaluate selectors on (a segment): it passes."""
_NOTHING: tuple = (frozenset(), frozenset())


@functools.lru_cache(maxsize=4096)
def _reads_fields(text: str) -> bool:
    """Whether selector ``text`` reads an identifier other than a header property (a
    schema field or an application property)."""
    return any(not name.startswith(HEADER_PREFIX)
               for name in compile_selector(text).identifiers)


class Delivery:
    """The NIC over a burst, delivery per egress, digests, parked messages. Its
    methods run on the data-path thread with the agent's state (``DataPlaneAgent`` inherits
    them)."""

    # --- tables and framing -------------------------------------------------------------------
    def _run(self, batch: FrameBatch, idx: list[int], ctxs: list[tuple], now_ns: int) -> None:
        nic = self.nic
        n = len(idx)
        if n and idx[-1] == n - 1:  # 0..n-1 (ascending, no repeats): views, no gather
            offsets = batch.offsets[:n]
            lengths = batch.lengths[:n]
        else:
            sel = np.asarray(idx, dtype=np.int64)
            offsets = batch.offsets[sel]
            lengths = batch.lengths[sel]
        done = 0
        while done < n:
            result = nic.process(batch.buf, offsets[done:], lengths[done:])
            self._deliver(batch.buf, result, ctxs[done:], now_ns)
            if result.frames == 0:
                break
            done += result.frames

    def _ports_of_group(self, group: int) -> tuple[int, ...]:
        snap = self.nic.snapshot
        if snap.version != self._groups_version:
            self._groups = {g.group_id: g.ports for g in snap.entries.groups}
            self._groups_version = snap.version
        return self._groups.get(group, ())

    def _deliver(self, buf: np.ndarray, result: Any, ctxs: list[tuple], now_ns: int) -> None:
        nic = self.nic
        msgs = nic.batch
        m = result.messages
        frame_index = msgs["frame_index"][:m].tolist()
        keys = msgs["topic_key"][:m].tolist()
        tables = self.tables
        ports_map = tables.ports
        out_fabric = self._out[FABRIC]
        group_direct = tables.group_direct
        gp = self.guaranteed
        grouped: set[tuple[int, str]] = set()
        me = self.node_id
        counters = self.counters
        checked: dict[int, bool] = {}
        matched: dict[int, Any] = {}
        node_selectors = self.node_selectors
        rdv_on = tables.rendezvous
        if rdv_on:
            firsts: dict[int, bool] = {}
            seqs = msgs["sequence"][:m].tolist()
            stamps = msgs["publish_ts_ns"][:m].tolist()
            rdv_keys, rdv_regs, uncovered = self.rdv_keys, self.rdv_regs, self.rdv_uncovered
        own: dict | None = None  # one class per message: message -> its egresses (lazily)
        if result.descriptors:
            descs = nic.descriptors[: result.descriptors].tolist()
            qos_of = msgs["qos"][:m].tolist() if self.own_sessions else None
            for off, length, target, kind, index in descs:
                ingress, origin, stream, session, _, cls = ctxs[frame_index[index]]
                if rdv_on and not cls:
                    # rendezvous mode: a message is handled here once, whichever copy
                    # (from its ingress or a rendezvous core) comes first
                    first = firsts.get(index)
                    if first is None:
                        first = firsts[index] = self.rdv_dedup.first(
                            (stream, keys[index], seqs[index], stamps[index]))
                        if not first:
                            counters["rendezvous_duplicates_dropped"] += 1
                    if not first:
                        continue
                    self._counting = ingress
                if ingress:
                    ok = checked.get(index)
                    if ok is None:
                        ok = keys[index] in session.allowed and (
                            not session.acl_class or self._content_acl(session, buf, index,
                                                                       keys[index]))
                        checked[index] = ok
                        if ok:
                            session.published += 1
                        elif keys[index] in session.allowed:
                            pass  # the content ACL rejected it (counted there)
                        else:
                            session.denied += 1
                            counters["publish_denied"] += 1
                    if not ok:
                        continue
                ports = self._ports_of_group(target) if kind == _GROUP else (target,)
                for port in ports:
                    what = ports_map.get(port)
                    if what is None:
                        counters["no_port"] += 1
                    elif what[0] == "client":
                        if cls and not ingress:  # a guaranteed copy: guaranteed egresses only
                            continue
                        client = self.sessions.get(what[1])
                        if client is not None:
                            if (client.own_class & OWN_PLAIN and qos_of is not None
                                    and qos_of[index] == _GUARANTEED_QOS):
                                if own is None:
                                    own = self._egresses_of(descs, ports_map)
                                if ("gclient", what[1]) in own[index]:
                                    # its guaranteed egress takes it: over the reliable stream
                                    counters["own_class_spared"] += 1
                                    continue
                            if client.selectors is not None:
                                texts = client.selectors.get(keys[index])
                                if texts is not None and not self._selected(
                                        client.session_id, texts, buf, index, matched):
                                    client.selector_filtered += 1
                                    counters["selector_filtered"] += 1
                                    continue
                            if client.flow is not None:  # its client holds it off
                                self.flows.offer(client, keys[index], origin, stream, buf,
                                                 off, length)
                                continue
                            self._out[client.channel].add_message(
                                client.dest, origin, client.session_id, stream, buf, off, length)
                            client.delivered += 1
                    elif what[0] == "gclient":
                        if not cls and not ingress:
                            continue
                        client = self.sessions.get(what[1])
                        if client is not None:
                            if (client.own_class & OWN_GUARANTEED and qos_of is not None
                                    and qos_of[index] != _GUARANTEED_QOS and (
                                        client.selectors is None
                                        or keys[index] not in client.selectors)):
                                if own is None:
                                    own = self._egresses_of(descs, ports_map)
                                if ("client", what[1]) in own[index]:
                                    # its best-effort egress takes it (no selector guards it)
                                    counters["own_class_spared"] += 1
                                    continue
                            gp.to_client(client.session_id, origin, stream, buf, off, now_ns)
                            client.delivered += 1
                    elif what[0] == "gnode":
                        if ingress:
                            gp.to_node(what[1], stream, buf, off, now_ns)
                    elif rdv_on and not cls:
                        if not self._rdv_wanted(what[1], keys[index], ingress, origin, buf,
                                                index, matched, rdv_keys, rdv_regs,
                                                uncovered):
                            continue
                        self._to_node(what[1], keys[index], index, stream, buf, off, length,
                                      grouped)
                    elif ingress:
                        guard = node_selectors.get(what[1]) if node_selectors else None
                        if guard is not None:
                            texts = guard.get(keys[index])
                            if texts is not None and not self._selected(
                                    ("n", what[1]), texts, buf, index, matched):
                                counters["selector_filtered_link"] += 1
                                continue
                        via = group_direct.get(what[1]) if group_direct else None
                        if via is not None:  # once per message and group, to every member
                            if (index, via) not in grouped:
                                grouped.add((index, via))
                                self._out[via].add_message(0, me, 0, stream, buf, off, length)
                                counters["messages_to_appliances"] += 1
                            continue
                        hop = tables.next_hop.get(what[1])
                        if hop is None:
                            counters["unroutable"] += 1
                        elif tables.dup_keys and keys[index] in tables.dup_keys and (
                                what[1] in tables.alt_next_hop):  # duplication mode
                            dup = what[1] | route_apply.DUP_DEST_BIT
                            out_fabric.add_message(hop, me, dup, stream, buf, off, length)
                            out_fabric.add_message(tables.alt_next_hop[what[1]], me, dup,
                                                   stream, buf, off, length)
                            counters["duplicated_messages"] += 1
                            counters["messages_to_appliances"] += 1
                        else:
                            out_fabric.add_message(hop, me, what[1], stream, buf, off, length)
                            counters["messages_to_appliances"] += 1
        verdicts = nic.verdicts[:m]
        if m > _FEW and not (verdicts == _UNKNOWN).any() or (
                m <= _FEW and _UNKNOWN not in verdicts.tolist()):
            return
        self._park_unknown(buf, m, ctxs, now_ns)

    def _egresses_of(self, descs: list, ports_map: dict) -> dict[int, set]:
        """Message index -> the egresses (("client" or "gclient", session), ...) the
        descriptors ``descs`` give it: whether a session whose messages go once, in their
        class (``DpSession.own_class``), gets this one on its other egress too."""
        out: dict[int, set] = {}
        for _, _, target, kind, index in descs:
            ports = self._ports_of_group(target) if kind == _GROUP else (target,)
            found = out.get(index)
            if found is None:
                found = out[index] = set()
            for port in ports:
                what = ports_map.get(port)
                if what is not None:
                    found.add(what)
        return out

    def _rdv_wanted(self, dest: int, key: int, ingress: bool, origin: int, buf: np.ndarray,
                    index: int, matched: dict, rdv_keys: dict, rdv_regs: dict,
                    uncovered: dict) -> bool:
        """Rendezvous mode: whether message ``index`` goes to appliance ``dest``. From its
        ingress: when it carries one of ``dest``'s routing keys (``dest`` is their
        rendezvous core; counted ``rendezvous_sent``), when ``dest``'s own interest takes
        it (the flood-mode guard), or when a selector ``dest`` registered here is TRUE
        (counted ``rendezvous_matched``). Elsewhere (the first copy to arrive here): only
        the last (``rendezvous_forwarded``), never back to the appliance it came from, nor to
        a rendezvous core of the event's keys: the ingress sent it one already
        (``rendezvous_forward_spared``)."""
        counters = self.counters
        regs = rdv_regs.get(dest)
        reg = regs.get(key) if regs else None
        routing = rdv_keys.get(dest)
        texts = routing.get(key) if routing else None
        carried = texts is not None and self._selected(("k", dest), texts, buf, index, matched)
        if not ingress:
            if reg is None or dest == origin or not self._selected(("r", dest), reg, buf,
                                                                   index, matched):
                return False
            if carried:  # its ingress sent it there (a rendezvous core of the event's keys)
                counters["rendezvous_forward_spared"] += 1
                return False
            counters["rendezvous_forwarded"] += 1
            return True
        if carried:
            counters["rendezvous_sent"] += 1
            return True
        if key not in uncovered.get(dest, ()):
            guard = self.node_selectors.get(dest) if self.node_selectors else None
            texts = guard.get(key) if guard is not None else None
            if texts is None or self._selected(("n", dest), texts, buf, index, matched):
                return True
        if reg is not None and self._selected(("r", dest), reg, buf, index, matched):
            counters["rendezvous_matched"] += 1
            return True
        counters["selector_filtered_link"] += 1
        return False

    def _to_node(self, dest: int, key: int, index: int, stream: int, buf: np.ndarray,
                 off: int, length: int, grouped: set) -> None:
        """One copy of a message towards appliance ``dest`` (over a fabric group when it is
        a direct member, else its next hop)."""
        tables = self.tables
        via = tables.group_direct.get(dest) if tables.group_direct else None
        if via is not None:  # once per message and group, to every member
            if (index, via) not in grouped:
                grouped.add((index, via))
                self._out[via].add_message(0, self.node_id, 0, stream, buf, off, length)
                self.counters["messages_to_appliances"] += 1
            return
        hop = tables.next_hop.get(dest)
        if hop is None:
            self.counters["unroutable"] += 1
        else:
            self._out[FABRIC].add_message(hop, self.node_id, dest, stream, buf, off, length)
            self.counters["messages_to_appliances"] += 1

    def _selected(self, sid: Any, texts: tuple[str, ...], buf: np.ndarray, index: int,
                  matched: dict[int, Any]) -> bool:
        """Whether one of ``texts`` (the selectors of session ``sid``, or of destination
        ``("n", node)``, guarding this key) is TRUE for message ``index`` of the NIC's last
        burst: its event is built and matched once against every session's and
        destination's selectors (``matched`` keeps the answer per message)."""
        found = matched.get(index)
        if found is None:
            found = matched[index] = self._selector_match(buf, index)
        if found is _UNEVALUATED:
            return True
        if len(found) == 3 and isinstance(sid, tuple) and any(
                _reads_fields(t) for t in texts or self._selector_texts.get(sid, ())):
            return True  # judged without the schema a selector reads: a link passes it
        if not texts:  # ALL_SELECTORS: whichever of its selectors
            return sid in found[1]
        return any((sid, t) in found[0] for t in texts)

    def _selector_match(self, buf: np.ndarray, index: int) -> Any:
        """The (subscriber, selector) pairs TRUE for message ``index`` and their
        subscribers; ``_UNEVALUATED`` for a segment (evaluated by the client once whole)."""
        index_ = self.selector_index
        if index_ is None:
            return _UNEVALUATED
        rec = self.nic.batch[index]
        offset = int(rec["payload_offset"])
        payload = bytes(buf[offset:offset + int(rec["payload_len"])])
        flags = int(rec["flags"])
        if flags & EXTENSION_FLAGS:
            try:
                payload, _, seg = split_extensions(payload, flags)
            except ExtensionError:
                return _NOTHING  # the client drops it as malformed too
            if seg is not None:
                self.counters["selector_unevaluated_segments"] += 1
                return _UNEVALUATED
        header = {name: int(rec[name]) for name in HEADER_PROPERTIES}
        schema = self.selector_schemas.get(header["schema_id"])
        try:
            event = message_event(payload, schema, header)
        except OffloadUserError:  # a schema field hiding a header property: nothing to match
            self.counters["selector_event_refused"] += 1
            return _NOTHING
        if self._counting and self.tables.rendezvous:  # popularity: events published here
            self.attribute_counts.observe(
                [n for n, v in event.items()
                 if not n.startswith(HEADER_PREFIX) and normalize(v) is not None])
        found = index_.match(event)
        if schema is None and header["schema_id"]:
            # a schema this appliance does not know (yet: P&M's document may arrive after a
            # neighbour's selectors): judged on the header alone, which is final for this
            # appliance's own sessions (a subscribe naming its fields needs the schema here)
            # but not for a link, whose far appliance may know the fields (``_selected``)
            self.counters["selector_unknown_schema"] += 1
            return found, {sub for sub, _ in found}, True
        return found, {sub for sub, _ in found}

    def _content_acl(self, session: DpSession, buf: np.ndarray, index: int, key: int) -> bool:
        """Whether message ``index`` of the NIC's last burst, published by ``session`` (whose
        identity has a content ACL class), may go on: the class's verdict from the
        snapshot's compiled ACL stages (nic_offload/softnic/ingress_acl.py), counted per
        class and verdict; LOG goes on and writes an audit line (rate-limited)."""
        msgs = self.nic.batch
        offset = int(msgs["payload_offset"][index])
        length = int(msgs["payload_len"][index])
        action = ingress_acl.verdict(buf, offset, length, session.acl_class,
                                     self.nic.snapshot.tables)
        name = self.acl_classes.get(session.acl_class, (str(session.acl_class), None))[0]
        what = _ACL_OUTCOME.get(action, "rejected")
        self.counters[f"content_acl_{what}"] += 1
        self.counters[f"content_acl_{what}_class_{name}"] += 1
        if action == _ACL_LOG:
            self._acl_audit(session, buf, offset, length, key, name)
        return action in (_ACL_ACCEPT, _ACL_LOG)

    def _acl_audit(self, session: DpSession, buf: np.ndarray, offset: int, length: int,
                   key: int, name: str) -> None:
        """The audit line of a LOG verdict: who published, the topic, the class and the rule
        that decided; at most ``ACL_LOG_LINES_PER_S`` lines a second (the rest are counted
        in ``content_acl_log_lines_suppressed``, never lost from ``content_acl_logged``)."""
        now = time.monotonic_ns()
        if now >= self._acl_log_at:
            self._acl_log_at = now + 1_000_000_000
            self._acl_log_lines = 0
        if self._acl_log_lines >= ACL_LOG_LINES_PER_S:
            self.counters["content_acl_log_lines_suppressed"] += 1
            return
        self._acl_log_lines += 1
        acl = self.acl_classes.get(session.acl_class, (name, None))[1]
        rule = "?"
        if acl is not None:
            try:
                decided = acl.decide(bytes(buf[offset:offset + length]))[1]
                rule = decided.text if decided is not None else f"default {acl.default.value}"
            except Exception:  # a field beyond the payload: the reference cannot read it
                rule = "?"
        topic = session.topics.get(key, f"key 0x{key:016x}")
        log.warning("content ACL LOG: identity %r published to %r; class %r, rule %s",
                    session.identity, topic, name, rule)

    def _park_unknown(self, buf: np.ndarray, m: int, ctxs: list[tuple], now_ns: int) -> None:
        """Park the messages of the NIC's last burst (``m`` messages) whose key it did not
        know, until a snapshot knows it or their frame's deadline passes (``ctxs`` per
        frame of the burst)."""
        msgs = self.nic.batch
        counters = self.counters
        unknown = np.flatnonzero(self.nic.verdicts[:m] == _UNKNOWN)
        if len(unknown):
            frame_index = msgs["frame_index"][unknown].tolist()
            starts = msgs["payload_offset"][unknown] - ml.MESSAGE_HEADER_BYTES
            sizes = ml.MESSAGE_HEADER_BYTES + ((msgs["payload_len"][unknown].astype(np.int64)
                                                + msgs["topic_len"][unknown] + 7) & ~7)
            for f, start, size in zip(frame_index, starts.tolist(), sizes.tolist()):
                ctx = ctxs[f]
                if ctx[4] <= now_ns:
                    counters["parked_expired"] += 1
                elif len(self._parked) >= PARKED_MESSAGES:
                    counters["parked_full"] += 1
                else:
                    self._parked.append((ctx, buf[start : start + size].tobytes()))
                    counters["parked"] += 1

    # --- software NIC digests ------------------------------------------------------------------
    def _drain_digests(self) -> None:
        """Take the NIC's queued digests (punts, unknown keys, ACL logs): count them by
        reason and keep the latest unknown keys; the queue never fills, so the NIC's
        ``digest_drops`` stays for real overload. Runs only when digests are pending."""
        digests = self.nic.drain_digests()
        reasons = digests["reason"].tolist()
        counts = self.digests
        for reason in reasons:
            counts[_DIGEST_NAMES.get(reason, "digests_other")] += 1
        if _DIGEST_UNKNOWN_KEY in reasons:
            keys = digests["topic_key"][digests["reason"] == _DIGEST_UNKNOWN_KEY]
            self.unknown_keys.extend(keys[-UNKNOWN_KEYS_KEPT:].tolist())

    # --- parked messages ----------------------------------------------------------------------
    def ingress_ctx(self, session: DpSession, deadline: int, cls: int = 0) -> tuple:
        """The context of a frame a local client published (``_run``'s per-frame tuple:
        ingress, origin, stream, session, parking deadline, class)."""
        return (True, self.node_id, session.session_id, session, deadline, cls)

    def rerun_parked_before(self, version: int, now_ns: int) -> int:
        """Run the parked messages again when the tables moved on to snapshot ``version``
        since they were parked (their keys may be known now): before anything newer of
        their publishers runs on it, so none is overtaken. Returns how many ran."""
        if self._parked and version != self._parked_version:
            return self._rerun_parked(now_ns)
        return 0

    def _rerun_parked(self, now_ns: int) -> int:
        self._parked_version = self.nic.switch.current.version
        parked, self._parked = self._parked, deque()
        scratch = self._scratch
        total = len(parked)
        while parked:
            scratch.count = 0
            ctxs = []
            while parked and scratch.count < scratch.capacity:
                ctx, message = parked.popleft()
                slot = scratch.count
                start = int(scratch.offsets[slot])
                size = fl.FRAME_HEADER_BYTES + len(message)
                _HEADER.pack_into(memoryview(scratch.buf), start, fl.FRAME_MAGIC,
                                  fl.PROTOCOL_VERSION, _DATA, 0, 1, size, 0, 0, 0, 0)
                scratch.buf[start + fl.FRAME_HEADER_BYTES : start + size] = np.frombuffer(
                    message, np.uint8)
                scratch.lengths[slot] = size
                scratch.count = slot + 1
                ctxs.append(ctx)
            if not (_express.ENABLED and self.express.run_given(scratch, ctxs, now_ns,
                                                                 now_ns + self.parked_ttl_ns)):
                self._run(scratch, list(range(scratch.count)), ctxs, now_ns)
        self.counters["parked_reruns"] += total
        return total

    def _expire_parked(self, now_ns: int) -> None:
        parked = self._parked
        while parked and parked[0][0][4] <= now_ns:
            parked.popleft()
            self.counters["parked_expired"] += 1
