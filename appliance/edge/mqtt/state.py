"""What the MQTT session and its packet handlers share: a subscription's options and the
``Closed`` signal that ends a connection (counted by its reason)."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.edge.mqtt.codec import Reason


@dataclass
class SubOptions:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


class Closed(Exception):
    """Internal: the connection ends (``reason`` counted, ``code`` sent in 5.0)."""

    def __init__(self, reason: str, code: int = Reason.UNSPECIFIED, will: bool = True,
                 detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.code, self.will, self.detail = reason, code, will, detail
