"""``CachingAppliance``: an ``Appliance`` that runs its ``[cache]`` (docs/fault-tolerance.md).

``topicwire run`` starts one (an edge's ``EdgeAppliance`` is one too). The cache's logs open
after the appliance's channels and agents, before their threads start (a directory that
cannot be used stops the start with a ``ConfigError`` naming ``cache.dir``); the control
agent learns the cache's internal identity and where to hand replay requests; once the
appliance runs, the cache's agent starts and its session logs in through the client
endpoint (with ``acknowledge = "persisted"``, ``start`` returns once it has subscribed,
and the control plane refuses other logins until then: what a client published before
would be acknowledged without being kept). ``stop`` closes the cache first (its session
logs out while the appliance still runs, its logs are synced), then the appliance.
``status()`` adds the ``cache`` section and its counters. (The cache wraps
``appliance.node`` rather than being started by it: its session is a client of the
appliance, and ``appliance.client`` depends on ``appliance.node``.)
"""

from __future__ import annotations

from typing import Any

from appliance.errors import ConfigError
from appliance.node import Appliance
from datapath.topics.registry import KeyRegistry

CACHE_READY_S = 60.0
"""With ``cache.acknowledge = "persisted"``, how long ``start`` waits for the cache's session
to subscribe (the appliance is ready, and takes clients, only then)."""


class CachingAppliance(Appliance):
    """See the module docstring."""

    cache: Any = None
    """The ``CacheAgent`` (appliance/cache/agent.py) when ``[cache]`` is configured."""

    def _before_threads(self, registry: KeyRegistry) -> None:
        cfg = self.config
        if cfg.cache is None or self.control is None:
            return
        from appliance.cache.agent import CacheAgent
        from appliance.cache.settings import CACHE_IDENTITY

        if cfg.cache.acknowledge == "persisted":  # the data path holds local publishers' ACKs
            from appliance.cache.settings import CACHE_MAX_PAYLOAD_BYTES

            self.dataplane.command("persist_acks", CACHE_IDENTITY, CACHE_MAX_PAYLOAD_BYTES)
        self.cache = CacheAgent(cfg, cfg.cache, self.dataplane, registry)
        # NAKs the data path's senders can no longer answer are asked of the cache
        self.dataplane.command("cache_naks", CACHE_IDENTITY)
        self.control.internal_logins[CACHE_IDENTITY] = (self.cache.verifier,
                                                        self.cache.entitlements)
        self.control.cache = self.cache
        self.cache.relay_wakeup = self.control.wakeup  # answers to a neighbour's forwards

    def start(self) -> CachingAppliance:
        try:
            super().start()  # closes what it opened when it fails
        except BaseException:
            cache, self.cache = self.cache, None
            if cache is not None:
                cache.close()
            raise
        if self.cache is not None:
            try:
                self.cache.start()
                if self.cache.persisted_acks and not self.cache.ready.wait(CACHE_READY_S):
                    raise ConfigError(
                        f"the cache's session did not subscribe within {CACHE_READY_S:g} s "
                        "(cache.acknowledge = persisted: the appliance takes no client "
                        "before its cache keeps what they publish); see the log for why",
                        component="cache")
            except BaseException:
                self.stop("failed start")
                raise
        return self

    def stop(self, why: str = "stop", *, api_last: bool = False) -> None:
        cache, self.cache = self.cache, None
        if cache is not None:
            cache.close()
        super().stop(why, api_last=api_last)

    def status(self) -> dict[str, Any]:
        status = super().status()
        if self.cache is None or not status:
            return status
        section = dict(self.cache.status_snapshot)
        counters = section.pop("counters", {})
        return {**status, "cache": section,
                "counters": {**status.get("counters", {}), **counters}}
