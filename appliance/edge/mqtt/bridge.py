"""A bridge from the edge to an external MQTT broker (``[[mqtt.bridges]]``, docs/mqtt.md).

Each bridge is a native client session of the edge, logged in as its configured P&M identity
(its entitlements apply both ways), and an MQTT client of the remote broker (paho-mqtt, one
client object per connection):

- **out**: the native session subscribes to each ``out`` mapping's local pattern (both native
  classes with ``own_class``, as the edge's MQTT sessions do: each message comes once, a
  guaranteed one over the reliable stream, another best-effort). A message published
  guaranteed (MQTT QoS 1/2 or a native guaranteed publish) on a QoS 1 mapping enters the
  durable backlog (bridge_backlog.py) and is sent at QoS 1, removed only when the remote's
  PUBACK arrives; anything else goes at QoS 0 while connected (dropped and counted while
  not). Messages the bridge's own session published (those that came in from the remote)
  are never sent out.
- **in**: after each CONNACK the bridge subscribes to the ``in`` filters (5.0: No Local,
  Retain As Published, Retain Handling 1) and publishes what arrives natively (QoS 1 as
  guaranteed, QoS 0 best-effort) under ``local_prefix``; the PUBACK to the remote follows the
  native publish. A 5.0 message that carries this edge's origin tag (user property
  ``ORIGIN_PROPERTY``, set on everything the edge sends) went out from here: dropped, counted.
- **sending**: QoS 1 is pipelined: up to min(``max_inflight``, the remote's Receive Maximum)
  unacknowledged at once, oldest first; on each (re)connection everything still in the
  backlog goes again, in order (what the remote acknowledged is gone from it).
- **reconnect**: a lost or refused connection is tried again after a delay doubling from
  ``reconnect_min_ms`` to ``reconnect_max_ms``, times a random factor in [0.5, 1] (jitter);
  the delay starts again from the minimum after a CONNACK accepted the bridge.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from appliance.client.exactly_once import REPUBLISH_WINDOW
from appliance.client.messages import GUARANTEED_QOS
from appliance.dataplane.guaranteed import RELIABLE_STREAM_BIT
from appliance.edge.mqtt import bridge_meta
from appliance.edge.mqtt.bridge_backlog import Backlog, Entry
from appliance.edge.mqtt.bridge_config import BridgeConfig
from appliance.edge.mqtt.meta import MetadataTooLarge, from_headers
from appliance.edge.mqtt.topics import mqtt_matches, topic_problem
from appliance.errors import ConfigError

if TYPE_CHECKING:
    from appliance.edge.mqtt.server import MqttServer

log = logging.getLogger("topicwire.edge.mqtt.bridge")

ORIGIN_PROPERTY = "topicwire-origin"
"""5.0 user property on every message a bridge sends: the edge appliance's name."""
CONNECT_TIMEOUT_S = 10.0
"""How long a TCP connect plus CONNACK may take before the attempt counts as failed."""
STOP_TIMEOUT_S = 10.0
STOP_DRAIN_S = 5.0
"""On stop, how long the bridge waits for the remote to acknowledge what is in flight."""
REMOTE_RECEIVE_MAXIMUM = 65_535
"""A 5.0 remote without a Receive Maximum property (and any 3.1.1 remote) takes this many."""


class MqttBridge:
    """See the module docstring."""

    def __init__(self, server: MqttServer, cfg: BridgeConfig, edge_name: str) -> None:
        self.server = server
        self.cfg = cfg
        self.origin = edge_name
        self.client_id = cfg.client_id or f"{edge_name}-{cfg.name}"
        self.counters: Counter[str] = Counter()
        self._cv = threading.Condition()
        self._stopping = False
        self._draining = False
        """Stopping: nothing new is sent, the acknowledgements in flight are awaited."""
        self.connected = False
        self._client: Any = None
        self._inflight: dict[int, int] = {}
        """paho message id -> backlog seq, for this connection."""
        self._to_send: deque[Entry] = deque()
        self._reserved = 0
        """Window slots taken by publishes being handed to paho (``_pump``)."""
        self._early: dict[int, Any] = {}
        """Acknowledgements that arrived before ``_pump`` recorded their message id."""
        self.window = 0
        self.remote_receive_maximum: int | None = None
        self.inflight_peak = 0
        self.native: Any = None
        self.backlog: Backlog | None = None
        self._thread: threading.Thread | None = None
        self._last_native: Any = None
        self._guaranteed: set[str] = set()

    def count(self, name: str, n: int = 1) -> None:
        with self._cv:
            self.counters[name] += n

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> MqttBridge:
        """Open the backlog, log in the native session and subscribe the out patterns (a
        refusal is a ``ConfigError`` naming the key), then connect in the background."""
        from appliance.client.errors import ClientError, EntitlementError

        p = f"mqtt.bridges[{self.server.cfg.bridges.index(self.cfg)}]."
        if self.cfg.backlog_dir is not None:
            try:
                self.backlog = Backlog(self.cfg.backlog_dir / self.cfg.name,
                                       self.cfg.backlog_max_messages, self.cfg.backlog_max_bytes,
                                       self.count)
            except OSError as exc:
                raise ConfigError(f"{p}backlog_dir: cannot open the backlog: {exc}") from None
            with self._cv:
                self._to_send.extend(self.backlog.snapshot())
            if self.backlog.recovered:
                log.info("bridge %s: %d messages recovered from the backlog", self.cfg.name,
                         self.backlog.recovered)
        try:
            self.native = self.server.native_login(self.cfg.identity, REPUBLISH_WINDOW)
        except ClientError as exc:
            self.close()
            raise ConfigError(f"{p}identity: the bridge's native login as "
                              f"{self.cfg.identity!r} failed: {exc}") from None
        for i, m in enumerate(self.cfg.outs):
            try:
                self.native.subscribe(m.local, callback=self._on_native, own_class=True)
            except EntitlementError:
                self.close()
                raise ConfigError(f"{p}out[{i}].local: identity {self.cfg.identity!r} may not "
                                  f"subscribe to {m.local!r} (pm.identities)") from None
            try:
                self.native.subscribe(m.local, qos="guaranteed", callback=self._on_native,
                                      own_class=True)
                self._guaranteed.add(m.local)
            except ClientError:
                self.count("out_guaranteed_refused")
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"mqtt-bridge-{self.cfg.name}")
        self._thread.start()
        return self

    def close(self) -> None:
        """Wait up to ``STOP_DRAIN_S`` for the PUBACKs of what is in flight (sending nothing
        new), then disconnect, stop, log out, sync and close the backlog (safe twice)."""
        with self._cv:
            self._draining = True
            self._cv.notify_all()
            if not self._cv.wait_for(lambda: not self.connected or not (
                    self._inflight or self._reserved), STOP_DRAIN_S):
                log.info("bridge %s: stopping with %d messages unacknowledged (kept in the "
                         "backlog)", self.cfg.name, len(self._inflight))
            self._stopping = True
            self._cv.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(STOP_TIMEOUT_S)
        native, self.native = self.native, None
        if native is not None:
            try:
                native.close()
            except Exception as exc:  # stop anyway
                log.warning("bridge %s: native logout: %r", self.cfg.name, exc)
        if self.backlog is not None:
            self.backlog.close()

    # --- the connection ------------------------------------------------------------------------
    def _run(self) -> None:
        attempt = 0
        while True:
            with self._cv:
                if self._stopping:
                    return
            accepted = False
            try:
                accepted = self._connect_once()
                if accepted:
                    attempt = 0
                    self._pump()
            except Exception as exc:  # a bug: log it, keep the bridge going
                self.count("internal_errors")
                log.exception("bridge %s: %r", self.cfg.name, exc)
            self._teardown()
            with self._cv:
                if self._stopping:
                    return
            base_ms = min(self.cfg.reconnect_max_ms, self.cfg.reconnect_min_ms * (2 ** attempt))
            attempt = min(attempt + 1, 32)
            delay_s = base_ms / 1e3 * random.uniform(0.5, 1.0)
            with self._cv:
                self._cv.wait_for(lambda: self._stopping, delay_s)

    def _connect_once(self) -> bool:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        cfg = self.cfg
        v5 = cfg.protocol == 5
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
                             reconnect_on_failure=False,
                             **({} if v5 else {"clean_session": cfg.session_expiry_s == 0}))
        client.max_inflight_messages_set(0)  # the bridge keeps its own window
        client.max_queued_messages_set(0)
        client.connect_timeout = CONNECT_TIMEOUT_S
        if cfg.username is not None:
            client.username_pw_set(cfg.username, cfg.password)
        if cfg.tls:
            client.tls_set(ca_certs=None if cfg.tls_ca_file is None else str(cfg.tls_ca_file),
                           certfile=None if cfg.tls_cert_file is None else str(cfg.tls_cert_file),
                           keyfile=None if cfg.tls_key_file is None else str(cfg.tls_key_file))
        connack: dict[str, Any] = {}
        got = threading.Event()

        def on_connect(_c: Any, _u: Any, flags: Any, rc: Any, props: Any) -> None:
            connack.update(rc=rc, props=props, present=bool(flags.session_present))
            got.set()

        def on_disconnect(*args: Any) -> None:  # (TLS refused: even inside connect())
            got.set()
            self._on_disconnect(*args)

        client.on_connect = on_connect
        client.on_disconnect = on_disconnect
        client.on_connect_fail = lambda *_: got.set()
        client.on_publish = self._on_publish
        client.on_message = self._on_remote
        client.on_subscribe = self._on_suback
        self.count("connect_attempts")
        extra: dict[str, Any] = {}
        if v5:
            props = Properties(PacketTypes.CONNECT)
            if cfg.session_expiry_s:
                props.SessionExpiryInterval = cfg.session_expiry_s
            extra = {"clean_start": cfg.session_expiry_s == 0, "properties": props}
        with self._cv:
            self._client = client
        try:
            client.connect(cfg.host, cfg.port, keepalive=cfg.keep_alive_s, **extra)
        except (OSError, ValueError) as exc:
            self.count("connect_failed")
            self._log_once("connect", f"cannot connect to {cfg.host}:{cfg.port}: {exc}")
            return False
        client.loop_start()
        if not got.wait(CONNECT_TIMEOUT_S) or connack.get("rc") is None:
            self.count("connect_failed")
            self._log_once("connect", f"no CONNACK from {cfg.host}:{cfg.port}")
            return False
        rc = connack["rc"]
        if rc.is_failure:
            self.count("connect_refused")
            self._log_once("connect", f"{cfg.host}:{cfg.port} refused the bridge: {rc}")
            return False
        receive_maximum = REMOTE_RECEIVE_MAXIMUM
        if v5 and connack["props"] is not None:
            receive_maximum = getattr(connack["props"], "ReceiveMaximum", receive_maximum)
        with self._cv:
            if self._stopping:
                return False
            self.remote_receive_maximum = receive_maximum if v5 else None
            self.window = min(cfg.max_inflight, receive_maximum)
            self.connected = True
            self.counters["connects"] += 1
            if self.counters["connects"] > 1:
                self.counters["reconnects"] += 1
            self._inflight.clear()
            self._early.clear()
            self._reserved = 0
            self._to_send = deque(self.backlog.snapshot() if self.backlog else ())
            self._cv.notify_all()
        self._logged = None
        log.info("bridge %s: connected to %s:%d (session present %s, window %d)", cfg.name,
                 cfg.host, cfg.port, connack["present"], self.window)
        if cfg.ins:
            self._subscribe_in(client)
        return True

    def _subscribe_in(self, client: Any) -> None:
        from paho.mqtt.subscribeoptions import SubscribeOptions

        if self.cfg.protocol == 5:
            topics = [(m.remote, SubscribeOptions(qos=m.qos, noLocal=True, retainAsPublished=True,
                                                  retainHandling=1)) for m in self.cfg.ins]
        else:
            topics = [(m.remote, m.qos) for m in self.cfg.ins]
        client.subscribe(topics)

    def _on_suback(self, _c: Any, _u: Any, _mid: int, codes: Any, _p: Any) -> None:
        for m, rc in zip(self.cfg.ins, codes):
            if rc.is_failure:
                self.count("in_subscribe_refused")
                log.warning("bridge %s: the remote refused the subscription %r: %s",
                            self.cfg.name, m.remote, rc)
            else:
                self.count("in_subscribed")

    def _log_once(self, what: str, text: str) -> None:
        if getattr(self, "_logged", None) != text:
            self._logged = text
            log.warning("bridge %s: %s (trying again with backoff)", self.cfg.name, text)

    def _on_disconnect(self, _c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        with self._cv:
            if self.connected:
                self.counters["disconnects"] += 1
            self.connected = False
            self._cv.notify_all()

    def _teardown(self) -> None:
        with self._cv:
            client, self._client = self._client, None
            was = self.connected
            self.connected = False
            self._inflight.clear()
        if client is not None:
            if was:
                client.disconnect()
            client.loop_stop()
            try:
                client.socket() and client.socket().close()
            except OSError:
                pass

    # --- sending -------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Send backlog entries while the window has room, until the connection ends. paho
        is never called with ``_cv`` held (its network thread holds its own locks when it
        calls ``_on_publish``, which takes ``_cv``)."""
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stopping or not self.connected or (
                    not self._draining and self._to_send
                    and self._reserved + len(self._inflight) < self.window))
                if self._stopping or not self.connected:
                    return
                client = self._client
                live = self.backlog.live if self.backlog is not None else {}
                batch = []
                while not self._draining and self._to_send and (
                        self._reserved + len(self._inflight) < self.window):
                    entry = self._to_send.popleft()
                    if entry.seq in live:  # else acknowledged meanwhile
                        batch.append(entry)
                        self._reserved += 1
            plain = self._props(None)
            for i, entry in enumerate(batch):
                props = plain
                if entry.meta:
                    meta = bridge_meta.meta_of_block(entry.meta, self.count)
                    if bridge_meta.expired(meta):  # its Message Expiry passed while kept
                        with self._cv:
                            self._reserved -= 1
                            self.counters["out_expired"] += 1
                            self._cv.notify_all()
                        self.backlog.ack(entry.seq)
                        continue
                    props = self._props(meta)
                info = client.publish(entry.topic, entry.payload, 1, entry.retain,
                                      properties=props)
                with self._cv:
                    self._reserved -= 1
                    if info.rc != 0:  # the connection went: the rest go on the next one
                        self._reserved -= len(batch) - i - 1
                        self._cv.notify_all()
                        return
                    self.counters["out_sent_qos1"] += 1
                    self._inflight[info.mid] = entry.seq
                    self.inflight_peak = max(self.inflight_peak,
                                             len(self._inflight) + self._reserved)
                    early = self._early.pop(info.mid, None)  # acknowledged before we got here
                    if not self._reserved:
                        self._early.clear()
                if early is not None:
                    self._acked(info.mid, early)

    def _props(self, meta: Any) -> Any:
        """A 5.0 PUBLISH's properties: ``meta``'s (bridge_meta.py) and the origin tag."""
        if self.cfg.protocol != 5:
            return None
        return bridge_meta.publish_properties(meta, ORIGIN_PROPERTY, self.origin)

    def _on_publish(self, _c: Any, _u: Any, mid: int, rc: Any, _p: Any) -> None:
        with self._cv:
            if mid not in self._inflight:
                if self._reserved:  # perhaps a QoS 1 publish not recorded yet (_pump)
                    self._early[mid] = rc
                return  # else QoS 0, or a connection that went
        self._acked(mid, rc)

    def _acked(self, mid: int, rc: Any) -> None:
        with self._cv:
            seq = self._inflight.pop(mid, None)
            if seq is None:
                return
            if rc is not None and rc.is_failure:
                self.counters["out_refused_by_remote"] += 1
            else:
                self.counters["out_acked"] += 1
            self._cv.notify_all()
        assert self.backlog is not None
        self.backlog.ack(seq)

    # --- from the fabric ------------------------------------------------------------------------
    def _on_native(self, msg: Any) -> None:
        """A message of an out pattern (the native client's thread; once per message)."""
        if msg is self._last_native:
            return
        self._last_native = msg
        native = self.native
        if native is None:
            return
        stream = msg.stream & ~RELIABLE_STREAM_BIT
        if msg.origin == self.server.node_id and stream == native.session:
            self.count("out_skipped_own")  # came in from the remote: never back
            return
        mapping = next((m for m in self.cfg.outs if mqtt_matches(m.local, msg.topic)), None)
        if mapping is None:
            return
        if not msg.guaranteed and msg.qos == GUARANTEED_QOS and mapping.local in \
                self._guaranteed:  # a best-effort copy (own_class: the appliance leaves it out)
            self.count("out_guaranteed_copies")
            return
        topic = mapping.remote_prefix + msg.topic
        if mapping.qos == 1 and msg.qos == GUARANTEED_QOS:
            assert self.backlog is not None
            entry = self.backlog.append(topic, msg.payload, 1, False,
                                        bridge_meta.header_block(msg.headers))
            if entry is None:
                self.count("out_dropped_backlog_full")
                return
            with self._cv:
                self.counters["out_backlogged"] += 1
                self._to_send.append(entry)
                self._cv.notify_all()
            return
        with self._cv:
            client = self._client if self.connected else None
        if client is None:
            self.count("out_dropped_qos0_disconnected")
            return
        meta = from_headers(msg.headers, self.count)[0] if msg.headers else None
        if bridge_meta.expired(meta):
            self.count("out_expired")
            return
        client.publish(topic, msg.payload, 0, False, properties=self._props(meta))
        self.count("out_sent_qos0")

    # --- from the remote ------------------------------------------------------------------------
    def _on_remote(self, _c: Any, _u: Any, message: Any) -> None:
        """A message of an in filter (paho's thread): into the fabric, then paho acks it."""
        from appliance.client.errors import ClientError, EntitlementError

        props = getattr(message, "properties", None)
        tags = getattr(props, "UserProperty", None) or []
        if any(k == ORIGIN_PROPERTY and v == self.origin for k, v in tags):
            self.count("in_dropped_origin")
            return
        mapping = next((m for m in self.cfg.ins if mqtt_matches(m.remote, message.topic)), None)
        if mapping is None:
            self.count("in_unmatched")
            return
        topic = mapping.local_prefix + message.topic
        if topic_problem(topic) is not None:
            self.count("in_dropped_bad_topic")
            return
        native = self.native
        if native is None:
            return
        try:
            headers = bridge_meta.fabric_headers(message, ORIGIN_PROPERTY)
        except MetadataTooLarge:
            self.count("in_dropped_metadata_too_large")
            return
        try:
            native.publish(topic, message.payload, flush=True, headers=headers,
                           qos="guaranteed" if message.qos >= 1 else "best-effort")
        except EntitlementError:
            self.count("in_denied")
            return
        except ClientError as exc:
            self.count("in_failed")
            log.warning("bridge %s: native publish failed: %s", self.cfg.name, exc)
            return
        self.count("in_messages")
        if message.retain:
            self.count("in_retained")

    # --- status ---------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        backlog = self.backlog
        with self._cv:  # (an acknowledgement counts under _cv before it leaves the backlog:
            # a backlog read here never shows a message gone that ``acked`` does not count)
            depth = 0 if backlog is None else len(backlog)
            depth_bytes = 0 if backlog is None else backlog.bytes
            counters = dict(sorted(self.counters.items()))
            inflight = len(self._inflight)
        return {"remote": f"{self.cfg.host}:{self.cfg.port}", "client_id": self.client_id,
                "protocol": "5" if self.cfg.protocol == 5 else "3.1.1",
                "connected": self.connected, "reconnects": counters.get("reconnects", 0),
                "window": self.window, "remote_receive_maximum": self.remote_receive_maximum,
                "inflight": inflight, "inflight_peak": self.inflight_peak,
                "backlog_messages": depth, "backlog_bytes": depth_bytes,
                "acked": counters.get("out_acked", 0),
                "dropped": counters.get("out_dropped_backlog_full", 0),
                "counters": counters}
