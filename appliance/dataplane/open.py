"""Opening what the data path owns: its channels, its agent, its idle strategy.

Used the same way whether the data path runs on a thread of the appliance's process
(``appliance.dataplane = "thread"``) or in a process of its own (``"process"``, the default:
appliance/dataplane/process.py calls these in the child). A port in use, an address not on
this host or a missing ring fails here as a ``ConfigError`` naming the config key.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from typing import Any

from appliance.config import (
    SHM_BUS_PRODUCERS,
    ApplianceConfig,
    ConfigError,
    GroupConfig,
    is_loopback_interface,
)
from appliance.dataplane.agent import DataPlaneAgent
from appliance.dataplane.names import CLIENT_SHM, CLIENT_UDP, FABRIC, GROUP_RX, GROUP_TX
from datapath.agent import (
    BackoffIdle,
    BusySpinIdle,
    IdleStrategy,
    PollingIdle,
    SleepingIdle,
    WaitSet,
    set_thread_priority,
)

IFF_MULTICAST = 0x1000
"""``struct net_device`` flag: the interface does multicast (/sys/class/net/IF/flags)."""


def loopback_multicast() -> bool:
    """Whether ``lo`` (in this network namespace) has multicast on."""
    try:
        flags = int(open("/sys/class/net/lo/flags").read().strip(), 16)
    except (OSError, ValueError):
        return True  # cannot tell: let the channel report what the kernel says
    return bool(flags & IFF_MULTICAST)


def _open(key: str, what: str, opener: Callable[[], Any]) -> Any:
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


def open_channels(cfg: ApplianceConfig) -> dict[str, Any]:
    """Every channel ``cfg`` asks for, by name (appliance/dataplane/names.py); on a failure
    the ones already open are closed and the ``ConfigError`` raised."""
    from channels import warm_up
    from channels.shm import ShmChannel
    from channels.udp import UdpChannel

    warm_up()
    channels: dict[str, Any] = {}
    try:
        if cfg.fabric_listen is not None:
            host, port = cfg.fabric_listen
            channels[FABRIC] = _open("fabric.listen", f"{host}:{port}", lambda: UdpChannel(
                (host, port), name=f"fabric:{host}:{port}"))
            if any(n.transport == "rdma" for n in cfg.neighbours):
                from appliance.dataplane.fabric_links import open_fabric_links

                channels[FABRIC] = open_fabric_links(cfg, channels[FABRIC])
        for i, group in enumerate(cfg.groups):
            _open_group(channels, i, group)
        if cfg.clients_udp is not None:
            host, port = cfg.clients_udp
            channels[CLIENT_UDP] = _open("clients.udp", f"{host}:{port}",
                                         lambda: UdpChannel((host, port),
                                                            name=f"clients:{host}:{port}"))
            if cfg.clients_rdma is not None:
                from appliance.dataplane.client_links import open_client_links

                channels[CLIENT_UDP] = open_client_links(cfg, channels[CLIENT_UDP])
        if cfg.clients_shm is not None:
            channels[CLIENT_SHM] = _open(
                "clients.shm", f"ring {cfg.clients_shm!r}",
                lambda: ShmChannel(rx=cfg.clients_shm, producers=SHM_BUS_PRODUCERS,
                                   name=f"clients:shm:{cfg.clients_shm}"))
    except BaseException:
        close_channels(channels)
        raise
    return channels


def _open_group(channels: dict[str, Any], index: int, group: GroupConfig) -> None:
    """The receiving (joined) and the send-only channel of one fabric group."""
    from channels.multicast import MulticastChannel

    key = f"fabric.groups[{index}]"
    if is_loopback_interface(group.interface) and not loopback_multicast():
        raise ConfigError(f"{key}.interface: the loopback interface has multicast off; "
                          "turn it on with `ip link set lo multicast on` (as root)")
    what = f"group {group.group}:{group.port} on {group.interface}"
    channels[GROUP_RX + group.name] = _open(key + ".interface", what, lambda: (
        MulticastChannel(group.group, group.port, interface=group.interface, ttl=group.ttl,
                         loopback=group.loopback, join=True,
                         name=f"group:{group.name}:{group.group}:{group.port}")))
    channels[GROUP_TX + group.name] = _open(key + ".interface", what, lambda: (
        MulticastChannel(group.group, group.port, interface=group.interface, ttl=group.ttl,
                         loopback=group.loopback, join=False,
                         name=f"group-tx:{group.name}:{group.group}:{group.port}")))


def close_channels(channels: dict[str, Any]) -> None:
    for channel in channels.values():
        channel.close()


def build_dataplane(cfg: ApplianceConfig, channels: dict[str, Any], switch: Any
                    ) -> DataPlaneAgent:
    """The data-path agent over ``channels`` reading tables from ``switch``, with its path
    telemetry attached and started when ``[telemetry]`` is configured."""
    from nic_offload.softnic import SoftNic

    dp = DataPlaneAgent(cfg.node_id, SoftNic(switch), channels,
                        fabric_max_frame_bytes=cfg.fabric_max_frame_bytes,
                        parked_ttl_ns=cfg.parked_ttl_ms * 1_000_000,
                        retransmit_buffer_messages=cfg.retransmit_buffer_messages)
    if getattr(cfg, "telemetry", None) is None:  # pyarrow (the store) is imported only then
        return dp
    from appliance.ops.telemetry.probe import attach  # [telemetry]: docs/routing.md

    try:  # its store's directory is made here (the config checked it can be)
        dp.telemetry = attach(cfg, channels)
    except OSError as exc:
        raise ConfigError(f"telemetry.dir: cannot make {cfg.telemetry.dir}: "
                          f"{exc.strerror or exc}") from None
    if dp.telemetry is not None:
        dp.telemetry.start()
    return dp


def idle_strategy(cfg: ApplianceConfig, dp: DataPlaneAgent,
                  extra_fds: tuple[int, ...] = ()) -> IdleStrategy:
    """The data path's idle strategy (``appliance.idle``); ``extra_fds`` also end a park
    (the data-path process's link to its control plane)."""
    wait_set = dp.wait_set
    if extra_fds:
        def wait_set() -> WaitSet:
            own = dp.wait_set()
            return WaitSet(own.fds + extra_fds, own.complete)
    return {"busy": BusySpinIdle, "backoff": BackoffIdle, "sleep": SleepingIdle,
            "block": lambda: PollingIdle(wait_set, dp.wakeup, wake_at_ns=dp.wake_at_ns,
                                         spin_ns=cfg.idle_spin_us * 1_000,
                                         spin_worth=dp.spin_worth)}[cfg.idle]()


def placement_hook(cfg: ApplianceConfig) -> Callable[[], None] | None:
    """The data-path runner's start hook (on its own thread): ``appliance.priority`` and
    ``appliance.dataplane_cpus``; None when both are the defaults."""
    nice, cpus = priority_hook(cfg.priority), cfg.dataplane_cpus
    if nice is None and not cpus:
        return None

    def apply() -> None:
        if nice is not None:
            nice()
        if cpus:
            pin_thread(cpus)
    return apply


def pin_thread(cpus: tuple[int, ...]) -> None:
    """Let the calling thread run only on ``cpus`` (``appliance.dataplane_cpus``); CPUs this
    process may not use are the config's error."""
    try:
        os.sched_setaffinity(threading.get_native_id(), cpus)
    except OSError as exc:
        allowed = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        raise ConfigError(f"appliance.dataplane_cpus: cannot run the data path on CPUs "
                          f"{list(cpus)} ({exc.strerror}); this process may use CPUs "
                          f"{allowed}") from None


def priority_hook(nice: int) -> Callable[[], None] | None:
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
