"""One appliance: the data path, the control agent, start and stop.

``Appliance(config).start()`` compiles the first table snapshot, then starts the data path:
by default in a process of its own, forked here (``appliance.dataplane = "process"``:
appliance/dataplane/process.py), or on a thread of this process (``"thread"``). Either way
the data path opens every channel first (a port in use or a missing ring fails the start, as a
``ConfigError`` naming the key) and the control agent reaches it through the same port
(commands, admin frames, snapshots, published counters). Then the control thread starts.
``stop()`` stops accepting logins, tells clients, lets queued frames leave within
``appliance.drain_timeout_ms``, stops the data path and closes the channels.
``[cache]`` is run by ``CachingAppliance`` (appliance/cache/node.py), which ``topicwire run``
starts: the cache keeps what a client session of its own receives, and ``appliance.client``
depends on this module (as the MQTT edge wraps it for the same reason); a plain
``Appliance`` refuses a config with ``[cache]``.
``reload(config)`` applies what of a new config can change at run time (appliance/reload.py;
``topicwire run`` calls it on SIGHUP).
``status()`` and ``submit()`` are the management contract (docs/appliance.md).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from appliance.build_info import version_line
from appliance.config import SUBMIT_TIMEOUT_S, ApplianceConfig, ConfigError
from appliance.control.agent import ControlAgent
from appliance.dataplane.open import (
    build_dataplane,
    close_channels,
    idle_strategy,
    open_channels,
    placement_hook,
)
from datapath.agent import AgentRunner, WakeableIdle
from datapath.errors import TopicwireError
from datapath.jit import JitWatch
from datapath.topics.registry import KeyRegistry

if TYPE_CHECKING:
    from appliance.dataplane.agent import DataPlaneAgent
    from appliance.dataplane.process import DataPathProcess
    from appliance.reload import Plan

log = logging.getLogger("topicwire.appliance")


def preload_registry(cfg: ApplianceConfig) -> KeyRegistry:
    """The key registry to start with: ``pm.registry``'s entries (a file that does not load
    is the config's error, ``ConfigError`` naming ``pm.registry``), else empty."""
    registry = KeyRegistry()
    if cfg.pm_registry is not None:
        from datapath.topics.registry import RegistryError

        try:
            registry.merge(KeyRegistry.load(cfg.pm_registry).entries())
        except RegistryError as exc:
            raise ConfigError(f"pm.registry: {exc}") from None
    return registry


class Appliance:
    """See the module docstring."""

    def __init__(self, config: ApplianceConfig) -> None:
        self.config = config
        self.channels: dict[str, Any] = {}
        self.dataplane: DataPlaneAgent | DataPathProcess | None = None
        """The data path's port: its agent (``appliance.dataplane = "thread"``) or the stand-in
        for its process (``"process"``, appliance/dataplane/process.py)."""
        self.control: ControlAgent | None = None
        self._dp_runner: AgentRunner | None = None
        self._cp_runner: AgentRunner | None = None
        self.mgmt: Any = None
        self._stopped = False

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Appliance:
        from nic_offload.compiler import OffloadCompiler
        from nic_offload.snapshot import SnapshotSwitch

        cfg = self.config
        registry = preload_registry(cfg)
        compiler = OffloadCompiler(registry)
        initial = compiler.build()
        self._launch_mgmt()
        try:
            # every kernel this process imported is loaded from the cache before any duty
            # cycle (docs/appliance.md, "Compiled kernels"); a forked data path inherits them
            from channels import warm_up

            warm_up()  # the channel kernels: clients of this process (edge, cache) use them
            # (said once the channels opened); a [cache]'s kernels are used later, by the
            # cache agent, and loaded now with the rest
            jit = JitWatch().start(warn=False, modules=(
                "appliance.persistence._kernels", "appliance.cache._kernels")
                if cfg.cache is not None else ())
            if cfg.dataplane == "process":
                from appliance.dataplane.process import DataPathProcess

                self.dataplane = DataPathProcess(cfg, initial).start()
            else:
                self.channels = open_channels(cfg)
                self.dataplane = build_dataplane(cfg, self.channels, SnapshotSwitch(initial))
            jit.warn_if_cold()
            self.control = ControlAgent(cfg, self.dataplane, compiler, registry)
            self._before_threads(registry)
            if cfg.persist_remote is not None:  # [cache] remote: held until it reports
                self.dataplane.command("persist_remote", 0, cfg.persist_remote)
            self.control.jit = jit
            if cfg.dataplane != "process":
                dp = self.dataplane
                self._dp_runner = AgentRunner([dp], idle_strategy(cfg, dp),
                                              name=f"{cfg.name}-dataplane",
                                              on_start=placement_hook(cfg))
            control = self.control
            self._cp_runner = AgentRunner([control], WakeableIdle(control.wakeup,
                                                                  control.wake_at_ns),
                                          name=f"{cfg.name}-control")
            if self._dp_runner is not None:
                self._dp_runner.start()
            self._cp_runner.start()
            self._start_mgmt()
        except BaseException:
            if self.mgmt is not None:  # launched, not serving: it ends at its feed's end
                self.mgmt.close()
                self.mgmt = None
            for runner in (self._cp_runner, self._dp_runner):  # threads stop before channels
                if runner is not None:
                    self._stop_runner(runner)
            self._stop_dataplane_process()
            telemetry = getattr(self.dataplane, "telemetry", None)
            if telemetry is not None:
                telemetry.close()  # its writer thread started above
            close_channels(self.channels)
            raise
        log.info("%s: appliance %s (id %d) running, data path %s; %s", cfg.name, cfg.role,
                 cfg.node_id, f"in process {self.dataplane.pid}"
                 if cfg.dataplane == "process" else "on a thread", version_line())
        passwordless = sorted(n for n, i in cfg.identities.items() if i.password is None)
        if cfg.pm_mode == "embedded" and cfg.pm_require_passwords and passwordless:
            log.warning("%s: pm: identities without a password cannot log in natively (P&M "
                        "requires one: pm.require_passwords): %s", cfg.name,
                        ", ".join(passwordless[:20]) + (" ..." if len(passwordless) > 20 else ""))
        return self

    def _before_threads(self, registry: KeyRegistry) -> None:
        """What a subclass opens once the channels and agents exist, before their threads
        start (``CachingAppliance``: the cache's logs)."""
        if self.config.cache is not None:
            raise ConfigError("cache: a plain Appliance does not run the cache; start "
                              "appliance.cache.node.CachingAppliance (topicwire run does)")

    def _launch_mgmt(self) -> None:
        """The management API's process, started before the channels and agents so that its
        interpreter's start overlaps with theirs (appliance.ops.mgmt.launch); ``_start_mgmt``
        completes it."""
        if not self.config.mgmt.get("listen"):
            return
        try:
            from appliance.ops import mgmt
        except ImportError:
            return  # said by _start_mgmt
        launch = getattr(mgmt, "launch", None)
        if launch is not None:
            self.mgmt = launch(self, self.config)

    def _start_mgmt(self) -> None:
        """The management API, when configured and available (appliance.ops.mgmt.serve)."""
        if not self.config.mgmt.get("listen"):
            return
        try:
            from appliance.ops import mgmt
        except ImportError:
            log.warning("%s: mgmt.listen is set but the management API is not installed",
                        self.config.name)
            return
        serve = getattr(mgmt, "serve", None)
        if serve is not None:
            self.mgmt = serve(self, self.config, self.mgmt)  # a failure: start's cleanup ends it

    def stop(self, why: str = "stop", *, api_last: bool = False) -> None:
        """Drain and stop (safe to call twice); ``why`` goes into the drain's log line
        (``topicwire run`` gives the signal's name). ``api_last``: the management API closes
        after the drain instead of before it, so that the answer to its ``shutdown`` command
        reaches the caller (commands are refused meanwhile: the appliance is stopping)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._stop(why, api_last)
        finally:
            if api_last:
                self._close_mgmt()

    def _close_mgmt(self) -> None:
        if self.mgmt is not None and hasattr(self.mgmt, "close"):
            self.mgmt.close()

    def shutdown_requested(self) -> str | None:
        """The reason given by the management API's ``shutdown`` command, once one came
        (``topicwire run`` then stops the appliance as on SIGTERM); None until then."""
        return getattr(self.control, "shutdown_reason", None)

    def _stop(self, why: str, api_last: bool) -> None:
        cfg = self.config
        if not api_last:
            self._close_mgmt()
        if self._cp_runner is not None:
            self._stop_runner(self._cp_runner)
        started = time.monotonic()
        if self.control is not None:
            control = self.control
            log.info("%s: draining (%s): logins refused, logging out %d client sessions and "
                     "telling %d neighbours; queued frames get up to %d ms", cfg.name, why,
                     len(control.sessions), sum(nb.up for nb in control.neighbours.values()),
                     cfg.drain_timeout_ms)
            control.logout_all()  # the control thread has stopped: safe from here
        dp = self.dataplane
        if self._dp_runner is None:  # in a process of its own: it sends all it was given
            self._stop_dataplane_process(cfg.drain_timeout_ms / 1e3)
            if dp is not None:
                log.info("%s: drained in %.0f ms", cfg.name, (time.monotonic() - started) * 1e3)
            log.info("%s: appliance stopped", cfg.name)
            return
        deadline = started + cfg.drain_timeout_ms / 1e3
        while dp is not None and dp.pending() and time.monotonic() < deadline:
            time.sleep(0.001)
        if dp is not None and self.control is not None:
            left = dp.pending()
            if left:
                log.warning("%s: drain: %d admin frames and commands still queued after %d ms "
                            "(appliance.drain_timeout_ms); dropped", cfg.name, left,
                            cfg.drain_timeout_ms)
            else:
                log.info("%s: drained in %.0f ms", cfg.name, (time.monotonic() - started) * 1e3)
        if self._dp_runner is not None:
            self._stop_runner(self._dp_runner)
        if dp is not None and dp.telemetry is not None:
            dp.telemetry.close()  # writes the last windows
        close_channels(self.channels)
        log.info("%s: appliance stopped", cfg.name)

    def _stop_dataplane_process(self, drain_s: float = 0.0) -> None:
        """Stop the data path's process (when it runs in one): it sends what it was given,
        closes its channels and exits, or is killed (appliance/dataplane/process.py)."""
        dp = self.dataplane
        if dp is None or self._dp_runner is not None or not hasattr(dp, "pid"):
            return
        try:
            dp.stop(drain_s)
        except TopicwireError as exc:
            log.error("%s: the data path had stopped with an error: %s", self.config.name, exc)

    def _stop_runner(self, runner: AgentRunner) -> None:
        try:
            runner.stop()
        except TopicwireError as exc:
            log.error("%s: %s stopped with an error: %s", self.config.name, runner.name, exc)

    def __enter__(self) -> Appliance:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def failure(self) -> BaseException | None:
        """The error that stopped an agent thread, if one did (the process should exit)."""
        for runner in (self._dp_runner, self._cp_runner):
            if runner is not None and runner.error is not None:
                return runner.error
        return getattr(self.dataplane, "error", None)

    def reload(self, new: ApplianceConfig) -> Plan:
        """Run with what of ``new`` (read and checked by ``load_config``) can change at run
        time, keeping every session (docs/appliance.md, "Reload (SIGHUP)";
        appliance/reload.py says which keys). Raises ``ConfigError`` for a config that would
        not start (the checks ``start`` makes on files, e.g. ``pm.registry``), leaving the
        running config in force. Logs each changed key that needs a restart; the caller
        applies ``log.*`` (the process's logging) and logs the summary."""
        from appliance.reload import plan

        if new.pm_registry is not None:
            preload_registry(new)  # the check start makes; a restart would load it
        out = plan(self.config, new)
        for key in out.restart:
            log.warning("%s: config: %s changed: restart needed to apply it", self.config.name,
                        key)
        if out.control:
            out.result = self.submit("reload", {"config": out.config})
            if not out.result.get("ok"):
                log.error("%s: reload: %s", self.config.name, out.result.get("error"))
        self.config = out.config
        return out

    # --- the management contract --------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The latest status snapshot (docs/appliance.md, "Status contract"); read-only."""
        if self.control is None:
            return {}
        return self.control.status_snapshot

    def channel_samples(self) -> list[dict[str, Any]]:
        """The channels' figures for ``/metrics`` (appliance/ops/mgmt/metrics.py
        ``channel_samples``): read from the channels on a thread data path, the latest its
        process sent otherwise."""
        if self._dp_runner is None:
            return list(getattr(self.dataplane, "published", {}).get("channel_samples", []))
        from appliance.ops.mgmt.metrics import channel_samples, channel_stats

        return channel_samples(channel_stats(self))

    def submit(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        """Apply a state-changing command on the control agent; ``{"ok": ...}``."""
        if self.control is None or self._stopped:
            return {"ok": False, "error": "appliance: not running"}
        return self.control.submit(command, dict(args), SUBMIT_TIMEOUT_S)
