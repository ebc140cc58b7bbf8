"""One appliance process: channels, the data-path agent, the control agent, start and stop.

``Appliance(config).start()`` opens every channel first (a port in use or a missing ring
fails here, as a ``ConfigError`` naming the key, before any thread starts), compiles the
first table snapshot, then starts the data-path thread and the control thread.
``stop()`` stops accepting logins, tells clients, lets queued frames leave within
``appliance.drain_timeout_ms``, stops both threads and closes the channels.
``[cache]`` is run by ``CachingAppliance`` (appliance/cache/node.py), which ``topicwire run``
starts: the cache keeps what a client session of its own receives, and ``appliance.client``
depends on this module (as the MQTT edge wraps it for the same reason); a plain
``Appliance`` refuses a config with ``[cache]``.
``reload(config)`` applies what of a new config can change at run time (appliance/reload.py;
``topicwire run`` calls it on SIGHUP).
``status()`` and ``submit()`` are the management contract (docs/appliance.md).
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from appliance.build_info import version_line
from appliance.config import (
    SHM_BUS_PRODUCERS,
    SUBMIT_TIMEOUT_S,
    ApplianceConfig,
    ConfigError,
    GroupConfig,
    is_loopback_interface,
)
from appliance.control.agent import ControlAgent
from appliance.dataplane.agent import (
    CLIENT_SHM,
    CLIENT_UDP,
    FABRIC,
    GROUP_RX,
    GROUP_TX,
    DataPlaneAgent,
)
from datapath.agent import (
    AgentRunner,
    BackoffIdle,
    BusySpinIdle,
    PollingIdle,
    SleepingIdle,
    WakeableIdle,
    set_thread_priority,
)
from datapath.errors import TopicwireError
from datapath.jit import JitWatch
from datapath.topics.registry import KeyRegistry

if TYPE_CHECKING:
    from appliance.reload import Plan

log = logging.getLogger("topicwire.appliance")


def _open(key: str, what: str, opener: Any) -> Any:
    from channels.errors import ChannelDeviceError, ChannelUserError

    try:
        return opener()
    except ChannelDeviceError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"{key}: {what} is in use by another socket; pick another port "
                              "or stop its owner") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"{key}: {what} is not an address of this host or namespace") \
                from None
        raise ConfigError(f"{key}: cannot open {what}: {exc}") from None
    except ChannelUserError as exc:
        raise ConfigError(f"{key}: cannot open {what}: {exc}") from None


def _priority(nice: int) -> Callable[[], None] | None:
    """The data-path runner's start hook for ``appliance.priority`` (None at 0: the thread
    keeps the process's); a priority the host refuses is the config's error."""
    if nice == 0:
        return None

    def apply() -> None:
        try:
            set_thread_priority(nice)
        except PermissionError as exc:
            raise ConfigError(
                f"appliance.priority: the data-path thread may not run at nice {nice} here "
                f"({exc.strerror}); run the appliance as root or with CAP_SYS_NICE, or set "
                "appliance.priority = 0") from None
    return apply


IFF_MULTICAST = 0x1000
"""``struct net_device`` flag: the interface does multicast (/sys/class/net/IF/flags)."""


def _loopback_multicast() -> bool:
    """Whether ``lo`` (in this network namespace) has multicast on."""
    try:
        flags = int(open("/sys/class/net/lo/flags").read().strip(), 16)
    except (OSError, ValueError):
        return True  # cannot tell: let the channel report what the kernel says
    return bool(flags & IFF_MULTICAST)


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
        self.dataplane: DataPlaneAgent | None = None
        self.control: ControlAgent | None = None
        self._dp_runner: AgentRunner | None = None
        self._cp_runner: AgentRunner | None = None
        self.mgmt: Any = None
        self._stopped = False

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> Appliance:
        from channels import warm_up
        from channels.shm import ShmChannel
        from channels.udp import UdpChannel
        from nic_offload.compiler import OffloadCompiler
        from nic_offload.snapshot import SnapshotSwitch
        from nic_offload.softnic import SoftNic

        cfg = self.config
        registry = preload_registry(cfg)
        warm_up()
        try:
            if cfg.fabric_listen is not None:
                host, port = cfg.fabric_listen
                self.channels[FABRIC] = _open("fabric.listen", f"{host}:{port}", lambda: UdpChannel(
                    (host, port), name=f"fabric:{host}:{port}"))
                if any(n.transport == "rdma" for n in cfg.neighbours):
                    from appliance.dataplane.fabric_links import open_fabric_links

                    self.channels[FABRIC] = open_fabric_links(cfg, self.channels[FABRIC])
            for i, group in enumerate(cfg.groups):
                self._open_group(i, group)
            if cfg.clients_udp is not None:
                host, port = cfg.clients_udp
                self.channels[CLIENT_UDP] = _open("clients.udp", f"{host}:{port}",
                                                  lambda: UdpChannel((host, port),
                                                                     name=f"clients:{host}:{port}"))
                if cfg.clients_rdma is not None:
                    from appliance.dataplane.client_links import open_client_links

                    self.channels[CLIENT_UDP] = open_client_links(cfg, self.channels[CLIENT_UDP])
            if cfg.clients_shm is not None:
                self.channels[CLIENT_SHM] = _open(
                    "clients.shm", f"ring {cfg.clients_shm!r}",
                    lambda: ShmChannel(rx=cfg.clients_shm, producers=SHM_BUS_PRODUCERS,
                                       name=f"clients:shm:{cfg.clients_shm}"))
            compiler = OffloadCompiler(registry)
            switch = SnapshotSwitch(compiler.build())
            nic = SoftNic(switch)
            self.dataplane = DataPlaneAgent(cfg.node_id, nic, self.channels,
                                            fabric_max_frame_bytes=cfg.fabric_max_frame_bytes,
                                            parked_ttl_ns=cfg.parked_ttl_ms * 1_000_000)
            self.control = ControlAgent(cfg, self.dataplane, switch, compiler, registry)
            from appliance.ops.telemetry.probe import attach  # [telemetry]: docs/routing.md

            try:  # its store's directory is made here (the config checked it can be)
                self.dataplane.telemetry = attach(cfg, self.channels)
            except OSError as exc:
                raise ConfigError(f"telemetry.dir: cannot make {cfg.telemetry.dir}: "
                                  f"{exc.strerror or exc}") from None
            if self.dataplane.telemetry is not None:
                self.dataplane.telemetry.start()
            self._before_threads(registry)
            # every kernel the agents call is imported by now: load what the cache holds for
            # them, so that no duty cycle compiles (docs/appliance.md, "Compiled kernels")
            self.control.jit = JitWatch().start()
            dp = self.dataplane
            idle = {"busy": BusySpinIdle, "backoff": BackoffIdle, "sleep": SleepingIdle,
                    "block": lambda: PollingIdle(dp.wait_set, dp.wakeup, wake_at_ns=dp.wake_at_ns,
                                                 spin_ns=cfg.idle_spin_us * 1_000,
                                                 spin_worth=dp.spin_worth)}[cfg.idle]()
            self._dp_runner = AgentRunner([self.dataplane], idle, name=f"{cfg.name}-dataplane",
                                          on_start=_priority(cfg.priority))
            control = self.control
            self._cp_runner = AgentRunner([control], WakeableIdle(control.wakeup,
                                                                  control.wake_at_ns),
                                          name=f"{cfg.name}-control")
            self._dp_runner.start()
            self._cp_runner.start()
            self._start_mgmt()
        except BaseException:
            for runner in (self._cp_runner, self._dp_runner):  # threads stop before channels
                if runner is not None:
                    self._stop_runner(runner)
            if self.dataplane is not None and self.dataplane.telemetry is not None:
                self.dataplane.telemetry.close()  # its writer thread started above
            self._close_channels()
            raise
        log.info("%s: appliance %s (id %d) running; %s", cfg.name, cfg.role, cfg.node_id,
                 version_line())
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

    def _open_group(self, index: int, group: GroupConfig) -> None:
        """The receiving (joined) and the send-only channel of one fabric group."""
        from channels.multicast import MulticastChannel

        key = f"fabric.groups[{index}]"
        if is_loopback_interface(group.interface) and not _loopback_multicast():
            raise ConfigError(f"{key}.interface: the loopback interface has multicast off; "
                              "turn it on with `ip link set lo multicast on` (as root)")
        what = f"group {group.group}:{group.port} on {group.interface}"
        self.channels[GROUP_RX + group.name] = _open(key + ".interface", what, lambda: (
            MulticastChannel(group.group, group.port, interface=group.interface, ttl=group.ttl,
                             loopback=group.loopback, join=True,
                             name=f"group:{group.name}:{group.group}:{group.port}")))
        self.channels[GROUP_TX + group.name] = _open(key + ".interface", what, lambda: (
            MulticastChannel(group.group, group.port, interface=group.interface, ttl=group.ttl,
                             loopback=group.loopback, join=False,
                             name=f"group-tx:{group.name}:{group.group}:{group.port}")))

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
            self.mgmt = serve(self, self.config)

    def stop(self, why: str = "stop") -> None:
        """Drain and stop (safe to call twice); ``why`` goes into the drain's log line
        (``topicwire run`` gives the signal's name)."""
        if self._stopped:
            return
        self._stopped = True
        cfg = self.config
        if self.mgmt is not None and hasattr(self.mgmt, "close"):
            self.mgmt.close()
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
        deadline = started + cfg.drain_timeout_ms / 1e3
        dp = self.dataplane
        while dp is not None and (dp.outbox or len(dp.commands)) and time.monotonic() < deadline:
            time.sleep(0.001)
        if dp is not None and self.control is not None:
            left = len(dp.outbox) + len(dp.commands)
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
        self._close_channels()
        log.info("%s: appliance stopped", cfg.name)

    def _stop_runner(self, runner: AgentRunner) -> None:
        try:
            runner.stop()
        except TopicwireError as exc:
            log.error("%s: %s stopped with an error: %s", self.config.name, runner.name, exc)

    def _close_channels(self) -> None:
        for channel in self.channels.values():
            channel.close()

    def __enter__(self) -> Appliance:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def failure(self) -> BaseException | None:
        """The error that stopped an agent thread, if one did (the process should exit)."""
        for runner in (self._dp_runner, self._cp_runner):
            if runner is not None and runner.error is not None:
                return runner.error
        return None

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

    def submit(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        """Apply a state-changing command on the control agent; ``{"ok": ...}``."""
        if self.control is None or self._stopped:
            return {"ok": False, "error": "appliance: not running"}
        return self.control.submit(command, dict(args), SUBMIT_TIMEOUT_S)
