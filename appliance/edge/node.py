"""``EdgeAppliance``: an ``Appliance`` that runs the edge's protocol servers beside it.

``topicwire run`` uses it for ``appliance.role = "edge"``. It starts the appliance (with its
``[cache]``, if any: ``CachingAppliance``) first,
then the MQTT server when ``[mqtt]`` is configured (a port in use stops the start with a
``ConfigError`` naming ``mqtt.listen``, and the appliance is stopped again); ``stop`` closes
the MQTT server first (its connections' native sessions log out while the appliance still
runs), then the appliance. ``status()`` adds the ``mqtt`` section (docs/mqtt.md).
(The edge wraps ``appliance.node`` rather than being started by it: the MQTT server is a
client of the appliance, and ``appliance.client`` depends on ``appliance.node``.)
"""

from __future__ import annotations

from typing import Any

from appliance.cache.node import CachingAppliance


class EdgeAppliance(CachingAppliance):
    """See the module docstring."""

    mqtt: Any = None

    def start(self) -> EdgeAppliance:
        if self.config.mqtt is not None:
            # the MQTT framing kernel is loaded from numba's cache with the appliance's own
            # kernels, before its threads start (datapath.jit.preload; docs/mqtt.md)
            import appliance.edge.mqtt._kernels  # noqa: F401
        super().start()
        if self.config.mqtt is not None:
            from appliance.edge.mqtt.server import MqttServer

            try:
                self.mqtt = MqttServer(self, self.config).start()
            except BaseException:
                super().stop("failed start")
                raise
        return self

    def stop(self, why: str = "stop", *, api_last: bool = False) -> None:
        mqtt, self.mqtt = self.mqtt, None
        if mqtt is not None:
            mqtt.close()
        super().stop(why, api_last=api_last)

    def status(self) -> dict[str, Any]:
        status = super().status()
        if self.mqtt is None or not status:
            return status
        return {**status, "mqtt": self.mqtt.status()}
