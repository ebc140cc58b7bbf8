"""The verbs side of the RDMA channel: pyverbs loading, device/port/GID choice, one RC endpoint.

pyverbs is imported on first use only: hosts without RDMA never load it. Debian's
``python3-pyverbs`` (built against the system's libibverbs) lives in
``/usr/lib/python3/dist-packages``, outside a venv; ``load_pyverbs`` imports that one package
from there when the running interpreter cannot find it, without putting the rest of Debian's
Python packages on ``sys.path``. (PyPI's pyverbs must match the C library's private ABI and
does not load against Debian's rdma-core 44.)

``Endpoint`` owns the resources of one reliable-connection end, children closed before their
parents: registered memory regions carved out of the channel's own numpy buffers (a send
ring, a receive ring, an 8-byte credit word the peer writes), a completion queue per
direction, the RC queue pair, and work requests built once per ring slot. Per packet, the
hot path changes one SGE length and posts.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import ipaddress
import os
import random
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from channels._rdma_errors import (
    RdmaDeviceError,
    RdmaGidError,
    RdmaNoDeviceError,
    RdmaPortDownError,
)

PYVERBS_SYSTEM_DIR = "/usr/lib/python3/dist-packages"
"""Where Debian's python3-pyverbs installs the ``pyverbs`` package."""
PAGE_BYTES = 4096
CREDIT_WR_ID = 1 << 40
"""wr_id of the credit write (send-ring slots use their index)."""
_SGE_LENGTH_OFFSET = 8
"""Offset of ``length`` in ``struct ibv_sge`` (addr u64, length u32, lkey u32)."""

_V: SimpleNamespace | None = None


def load_pyverbs() -> SimpleNamespace:
    """The pyverbs modules the channel uses, imported once (``RdmaNoDeviceError`` if none)."""
    global _V
    if _V is not None:
        return _V
    try:
        import pyverbs  # noqa: F401
    except ImportError:
        init = os.path.join(PYVERBS_SYSTEM_DIR, "pyverbs", "__init__.py")
        if not os.path.exists(init):
            raise RdmaNoDeviceError(
                "rdma: pyverbs is not installed; install Debian's python3-pyverbs "
                "(`make hwtest` does), PyPI's pyverbs does not load against rdma-core 44"
            ) from None
        spec = importlib.util.spec_from_file_location(
            "pyverbs", init, submodule_search_locations=[os.path.dirname(init)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["pyverbs"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules["pyverbs"]
            raise
    names = ("device", "enums", "pd", "mr", "cq", "qp", "wr", "addr", "pyverbs_error")
    try:
        mods = {name: importlib.import_module(f"pyverbs.{name}") for name in names}
    except ImportError as exc:
        raise RdmaNoDeviceError(f"rdma: pyverbs does not load ({exc}); reinstall "
                                "python3-pyverbs matching this rdma-core") from None
    _V = SimpleNamespace(**mods)
    return _V


def verbs_error(what: str, exc: Exception) -> RdmaDeviceError:
    """An ``RdmaDeviceError`` for a failed verbs call, keeping pyverbs' errno."""
    code = getattr(exc, "error_code", 0) or 0
    code = abs(code) if isinstance(code, int) else 0
    detail = f"{os.strerror(code)}" if code else str(exc)
    return RdmaDeviceError(f"rdma: {what} failed: {detail} ({exc})", errno=code or None)


def wc_status_name(status: int) -> str:
    """``IBV_WC_RETRY_EXC_ERR`` for its number."""
    v = load_pyverbs()
    for name in dir(v.enums):
        if name.startswith("IBV_WC_") and name.endswith("_ERR") or name == "IBV_WC_SUCCESS":
            if getattr(v.enums, name) == status:
                return name
    return f"status {status}"


# --- devices, ports and GIDs --------------------------------------------------------------

@dataclass(frozen=True)
class PortGid:
    """Where one end sends from: device, port, GID index and the GID itself."""

    device: str
    port: int
    gid_index: int
    gid: str
    """8 groups of 4 hex digits, as pyverbs' GID() wants it."""
    mtu: int
    """The port's active MTU (an ``IBV_MTU_*`` enum value)."""


def ipv4_mapped_gid(ipv4: str) -> str:
    """The RoCE v2 GID of an IPv4 address (``::ffff:a.b.c.d``), in pyverbs' 8-group form."""
    return ipaddress.IPv6Address(f"::ffff:{ipaddress.IPv4Address(ipv4)}").exploded


def _same_gid(a: str, b: str) -> bool:
    try:
        return ipaddress.IPv6Address(a) == ipaddress.IPv6Address(b)
    except ValueError:
        return False


def device_names() -> list[str]:
    """Names of the RDMA devices here; ``RdmaNoDeviceError`` when there are none."""
    v = load_pyverbs()
    try:
        devices = v.device.get_device_list()
    except v.pyverbs_error.PyverbsError as exc:
        raise RdmaNoDeviceError(
            f"rdma: no RDMA device here (pyverbs: {exc}); this kernel needs an RDMA NIC or "
            "soft-RoCE (`modprobe rdma_rxe; rdma link add rxe0 type rxe netdev IFACE`, or run "
            "`make hwtest`, which boots a VM that has it)") from None
    names = [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devices]
    if not names:
        raise RdmaNoDeviceError("rdma: no RDMA device here; add one (soft-RoCE: `rdma link "
                                "add rxe0 type rxe netdev IFACE`) or run `make hwtest`")
    return names


def _gid_table(ctx: Any, v: SimpleNamespace) -> list:
    attr = ctx.query_device()
    size = sum(ctx.query_port(p).gid_tbl_len for p in range(1, attr.phys_port_cnt + 1))
    return list(ctx.query_gid_table(max(size, 1)))


def _describe(entries: list, v: SimpleNamespace) -> str:
    roce2 = v.enums.IBV_GID_TYPE_ROCE_V2
    shown = [f"{e.gid_index}={ipaddress.IPv6Address(e.gid_str()).compressed}"
             f"{'' if e.gid_type == roce2 else ' (RoCE v1/IB)'}" for e in entries
             if int(ipaddress.IPv6Address(e.gid_str()))]
    return ", ".join(shown) or "none"


def choose_port_gid(address: str | None, *, device: str | None = None, port: int = 1,
                    gid_index: int | None = None) -> PortGid:
    """The device, port and GID an end at IPv4 ``address`` sends from.

    Without ``device`` every device is searched for the IPv4-mapped RoCE v2 GID of
    ``address``; ``gid_index`` picks an index outright (it must hold a GID, and that of
    ``address`` if one is given). The port must be ACTIVE.
    """
    v = load_pyverbs()
    names = device_names()
    if device is not None and device not in names:
        raise RdmaNoDeviceError(f"rdma: no RDMA device named {device!r} here (devices: "
                                f"{', '.join(names)}); see `rdma link show`")
    wanted = ipv4_mapped_gid(address) if address is not None else None
    roce2 = v.enums.IBV_GID_TYPE_ROCE_V2
    seen: list[str] = []
    for name in [device] if device is not None else names:
        ctx = v.device.Context(name=name)
        try:
            entries = [e for e in _gid_table(ctx, v) if e.port_num == port]
            if gid_index is not None:
                entry = next((e for e in entries if e.gid_index == gid_index), None)
                if entry is None or not int(ipaddress.IPv6Address(entry.gid_str())):
                    raise RdmaGidError(
                        f"rdma: GID index {gid_index} of {name} port {port} is empty; "
                        f"its GIDs: {_describe(entries, v)}; leave gid_index unset to look "
                        "the address up")
                if wanted is not None and not _same_gid(entry.gid_str(), wanted):
                    raise RdmaGidError(
                        f"rdma: GID index {gid_index} of {name} port {port} is "
                        f"{ipaddress.IPv6Address(entry.gid_str()).compressed}, not the GID of "
                        f"{address}; its GIDs: {_describe(entries, v)}")
            else:
                matches = [e for e in entries if wanted is None or
                           _same_gid(e.gid_str(), wanted)]
                matches = [e for e in matches if int(ipaddress.IPv6Address(e.gid_str()))]
                matches.sort(key=lambda e: (e.gid_type != roce2, e.gid_index))
                if wanted is None:
                    mapped = [e for e in matches if ipaddress.IPv6Address(
                        e.gid_str()).ipv4_mapped is not None]
                    matches = mapped or matches
                if not matches:
                    seen.append(f"{name}: {_describe(entries, v)}")
                    continue
                entry = matches[0]
            state = ctx.query_port(port)
            if state.state != v.enums.IBV_PORT_ACTIVE:
                raise RdmaPortDownError(
                    f"rdma: port {port} of {name} is not active (state {state.state}, "
                    f"physical state {state.phys_state}); bring its netdev up "
                    "(`ip link set IFACE up`, `rdma link show`)")
            return PortGid(name, port, int(entry.gid_index),
                           ipaddress.IPv6Address(entry.gid_str()).exploded,
                           int(state.active_mtu))
        finally:
            ctx.close()
    raise RdmaGidError(
        f"rdma: no RDMA device has a GID for {address} on port {port} ({'; '.join(seen)}); "
        "use an address of a netdev that carries RDMA (`rdma link show`) or pass device= "
        "and gid_index=")


# --- one RC endpoint ----------------------------------------------------------------------

def aligned_buffer(nbytes: int, dtype: Any = np.uint8) -> np.ndarray:
    """A zeroed numpy array starting on a page boundary (for memory registration)."""
    raw = np.zeros(nbytes + PAGE_BYTES, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE_BYTES
    return raw[start : start + nbytes].view(dtype)


@dataclass(frozen=True)
class QpInfo:
    """What one end tells the other over the out-of-band connection."""

    qpn: int
    psn: int
    gid: str
    mtu: int
    recv_packets: int
    packet_bytes: int
    credit_addr: int
    credit_rkey: int

    def as_dict(self) -> dict[str, int | str]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class QpTimers:
    """Transport timers and retry counts of the queue pair (``channels.rdma`` constants)."""

    ack_timeout: int
    retry_count: int
    rnr_retry: int
    min_rnr_timer: int


class Endpoint:
    """The verbs resources of one RC connection end; ``close()`` is safe twice."""

    def __init__(self, where: PortGid, *, packet_bytes: int, send_packets: int,
                 recv_packets: int) -> None:
        v = self.v = load_pyverbs()
        e = v.enums
        self.where = where
        self.packet_bytes = packet_bytes
        self.send_packets = send_packets
        self.recv_packets = recv_packets
        self._closers: list[Any] = []
        self.ctx = self.qp = None
        try:
            self.ctx = v.device.Context(name=where.device)
            self.pd = self._own(v.pd.PD(self.ctx))
            self.send_buf = aligned_buffer(send_packets * packet_bytes)
            self.recv_buf = aligned_buffer(recv_packets * packet_bytes)
            self.credit = aligned_buffer(16, np.uint64)
            """[0]: receives the peer has posted in all (the peer writes it); [1]: ours, the
            source of our writes to the peer."""
            local = e.IBV_ACCESS_LOCAL_WRITE
            self.send_mr = self._own(v.mr.MR(self.pd, self.send_buf.nbytes, local,
                                             address=self.send_buf.ctypes.data))
            self.recv_mr = self._own(v.mr.MR(self.pd, self.recv_buf.nbytes, local,
                                             address=self.recv_buf.ctypes.data))
            self.credit_mr = self._own(v.mr.MR(self.pd, self.credit.nbytes,
                                               local | e.IBV_ACCESS_REMOTE_WRITE,
                                               address=self.credit.ctypes.data))
            self.send_cq = self._own(v.cq.CQ(self.ctx, send_packets + 1, None, None, 0))
            self.recv_cq = self._own(v.cq.CQ(self.ctx, recv_packets, None, None, 0))
            cap = v.qp.QPCap(max_send_wr=send_packets + 1, max_recv_wr=recv_packets,
                             max_send_sge=1, max_recv_sge=1)
            init = v.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.send_cq, rcq=self.recv_cq,
                                   cap=cap, sq_sig_all=1)
            self.qp = self._own(v.qp.QP(self.pd, init))
            self.psn = random.getrandbits(24)
            attr = v.qp.QPAttr(qp_state=e.IBV_QPS_INIT, port_num=where.port)
            attr.pkey_index = 0
            attr.qp_access_flags = local | e.IBV_ACCESS_REMOTE_WRITE
            self.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                           | e.IBV_QP_ACCESS_FLAGS)
            self._build_requests()
        except v.pyverbs_error.PyverbsError as exc:
            self.close()
            raise verbs_error(f"setting up {where.device} port {where.port}", exc) from None
        except BaseException:
            self.close()
            raise

    def _own(self, obj: Any) -> Any:
        self._closers.append(obj)
        return obj

    def _build_requests(self) -> None:
        v, e = self.v, self.v.enums
        p = self.packet_bytes
        recv_base, send_base = self.recv_buf.ctypes.data, self.send_buf.ctypes.data
        self.recv_wrs = [v.wr.RecvWR(wr_id=i, num_sge=1, sg=[v.wr.SGE(recv_base + i * p, p,
                                                                       self.recv_mr.lkey)])
                         for i in range(self.recv_packets)]
        self.send_sges = [v.wr.SGE(send_base + i * p, p, self.send_mr.lkey)
                          for i in range(self.send_packets)]
        self.send_wrs = [v.wr.SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge])
                         for i, sge in enumerate(self.send_sges)]
        # The length of each slot's send changes per packet. Newer pyverbs shows where a WR's
        # own SGE array is (write the length there); rdma-core 44's does not, but lets a WR
        # point at an SGE object's memory instead (then set the length through the SGE).
        try:
            self._length_at = [wr.sg_list + _SGE_LENGTH_OFFSET for wr in self.send_wrs]
            self._shared_sges = False
        except AttributeError:
            for wr, sge in zip(self.send_wrs, self.send_sges):
                wr.sg_list = sge
            self._length_at = []
            self._shared_sges = True
        credit_src = self.credit.ctypes.data + 8
        self.credit_wr = v.wr.SendWR(wr_id=CREDIT_WR_ID, opcode=e.IBV_WR_RDMA_WRITE,
                                     num_sge=1, sg=[v.wr.SGE(credit_src, 8,
                                                             self.credit_mr.lkey)])

    def info(self) -> QpInfo:
        """This end's half of the exchange."""
        return QpInfo(self.qp.qp_num, self.psn, self.where.gid, self.where.mtu,
                      self.recv_packets, self.packet_bytes, self.credit.ctypes.data,
                      self.credit_mr.rkey)

    def post_all_receives(self) -> None:
        """Post every receive slot (after INIT, before the peer may send)."""
        for wr in self.recv_wrs:
            self.qp.post_recv(wr)

    def connect(self, peer: QpInfo, timers: QpTimers) -> None:
        """INIT -> RTR -> RTS towards ``peer``; sets up the credit write's target."""
        v, e = self.v, self.v.enums
        gr = v.addr.GlobalRoute(dgid=v.addr.GID(peer.gid), sgid_index=self.where.gid_index,
                                hop_limit=1)
        attr = v.qp.QPAttr(qp_state=e.IBV_QPS_RTR, port_num=self.where.port,
                           path_mtu=min(self.where.mtu, peer.mtu))
        attr.dest_qp_num = peer.qpn
        attr.rq_psn = peer.psn
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = timers.min_rnr_timer
        attr.ah_attr = v.addr.AHAttr(port_num=self.where.port, is_global=1, gr=gr)
        try:
            self.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU
                           | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC
                           | e.IBV_QP_MIN_RNR_TIMER)
        except v.pyverbs_error.PyverbsError as exc:
            raise verbs_error(
                f"moving the queue pair to RTR towards GID {peer.gid} (if the peer's address "
                "is local to this host, sysctl net.ipv4.conf.all.accept_local=1 is needed)",
                exc) from None
        attr = v.qp.QPAttr(qp_state=e.IBV_QPS_RTS, port_num=self.where.port)
        attr.sq_psn = self.psn
        attr.timeout = timers.ack_timeout
        attr.retry_cnt = timers.retry_count
        attr.rnr_retry = timers.rnr_retry
        attr.max_rd_atomic = 1
        try:
            self.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT
                           | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
        except v.pyverbs_error.PyverbsError as exc:
            raise verbs_error("moving the queue pair to RTS", exc) from None
        self.credit_wr.set_wr_rdma(peer.credit_rkey, peer.credit_addr)

    # --- hot path ------------------------------------------------------------------------
    def post_send(self, slot: int, nbytes: int) -> None:
        """Send ``nbytes`` of send-ring slot ``slot`` (its prebuilt work request)."""
        if self._shared_sges:
            self.send_sges[slot].length = nbytes
        else:
            ctypes.c_uint32.from_address(self._length_at[slot]).value = nbytes
        self.qp.post_send(self.send_wrs[slot])

    def post_recv(self, slot: int) -> None:
        self.qp.post_recv(self.recv_wrs[slot])

    def post_credit(self, posted_total: int) -> None:
        """RDMA-write ``posted_total`` into the peer's credit word."""
        self.credit[1] = posted_total
        self.qp.post_send(self.credit_wr)

    def close(self) -> None:
        """Destroy the queue pair, then CQs, MRs, PD and the device context."""
        closers, self._closers = self._closers, []
        for obj in reversed(closers):
            try:
                obj.close()
            except Exception:  # keep closing the rest; nothing to report at teardown
                pass
        if getattr(self, "_shared_sges", False):
            for sge in self.send_sges:  # rdma-core 44: the WRs point at these; never close WRs
                sge.close()
            self.send_sges = []
        elif hasattr(self, "send_wrs"):
            for wr in self.send_wrs:
                wr.close()
        for wr in [*getattr(self, "recv_wrs", []), getattr(self, "credit_wr", None)]:
            if wr is not None:
                wr.close()
        self.recv_wrs = []
        self.credit_wr = None
        self.send_wrs = []
        if self.ctx is not None:
            try:
                self.ctx.close()
            except Exception:
                pass
            self.ctx = None
