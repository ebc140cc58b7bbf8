"""A paho-mqtt peer that waits for each answer with a deadline."""

from __future__ import annotations

import queue
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from tests.edge.conftest import DEADLINE_S, PASSWORDS, port_of

VERSIONS = {4: mqtt.MQTTv311, 5: mqtt.MQTTv5}


class Peer:
    """One paho-mqtt client connected to the edge (``rc``: the CONNACK's reason code)."""

    def __init__(self, edge: Any, client_id: str, user: str | None = "alice",
                 password: str | None = None, version: int = 4,
                 will: tuple[str, bytes, int, bool] | None = None, keepalive: int = 60,
                 clean: bool = True, props: Any = None, will_props: Any = None,
                 transport: str = "tcp", port: int | None = None, tls: Any = None) -> None:
        """``clean``: 3.1.1 clean session / 5.0 clean start; ``props``: 5.0 CONNECT
        properties (paho ``Properties``); ``transport``: ``tcp`` or ``websockets``;
        ``tls``: an ``ssl.SSLContext`` (with ``port``, the TLS listener's)."""
        self.messages: queue.Queue = queue.Queue()
        self._connacks: queue.Queue = queue.Queue()
        self._subacks: dict[int, queue.Queue] = {}
        self.version = version
        self.edge = edge
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                        protocol=VERSIONS[version], reconnect_on_failure=False,
                        transport=transport, **({} if version == 5 else {"clean_session": clean}))
        if tls is not None:
            c.tls_set_context(tls)
        if user is not None:
            c.username_pw_set(user, PASSWORDS.get(user, "") if password is None else password)
        c.on_connect = lambda _c, _u, f, rc, p: self._connacks.put((rc, f, p))
        c.on_message = lambda _c, _u, m: self.messages.put(m)
        c.on_subscribe = lambda _c, _u, mid, rcs, _p: self._sub_queue(mid).put(rcs)
        c.on_unsubscribe = lambda _c, _u, mid, rcs, _p: self._sub_queue(mid).put(rcs)
        if will is not None:
            c.will_set(*will, properties=will_props)
        self.client = c
        extra = {"clean_start": clean, "properties": props} if version == 5 else {}
        c.connect("127.0.0.1", port or port_of(edge), keepalive=keepalive, **extra)
        c.loop_start()
        self.rc, flags, self.connack_props = self._connacks.get(timeout=DEADLINE_S)
        self.session_present = bool(flags.session_present)

    def _sub_queue(self, mid: int) -> queue.Queue:
        return self._subacks.setdefault(mid, queue.Queue())

    def subscribe(self, topic_filter: str, qos: int = 0, options: Any = None,
                  props: Any = None) -> int:
        """The SUBACK's code for the filter (0..2 granted, >= 0x80 refused); ``options``: a
        5.0 ``SubscribeOptions`` instead of ``qos``; ``props``: 5.0 SUBSCRIBE properties."""
        if options is not None:
            _, mid = self.client.subscribe(topic_filter, options=options, properties=props)
        else:
            _, mid = self.client.subscribe(topic_filter, qos, properties=props)
        return self._sub_queue(mid).get(timeout=DEADLINE_S)[0].value

    def unsubscribe(self, topic_filter: str, props: Any = None) -> list[int]:
        """The UNSUBACK's reason codes (5.0; 3.1.1 has none: success codes from paho);
        ``props``: 5.0 UNSUBSCRIBE properties."""
        _, mid = self.client.unsubscribe(topic_filter, properties=props)
        return [rc.value for rc in self._sub_queue(mid).get(timeout=DEADLINE_S)]

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                props: Any = None) -> None:
        info = self.client.publish(topic, payload, qos, retain, properties=props)
        info.wait_for_publish(DEADLINE_S)
        assert info.is_published(), (self.client._client_id, getattr(self.edge, "mqtt", None)
                                      and self.edge.mqtt.status())

    def next(self, timeout_s: float = DEADLINE_S) -> Any:
        return self.messages.get(timeout=timeout_s)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
