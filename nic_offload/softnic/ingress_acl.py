"""One message's content ACL verdict from a snapshot's compiled ACL arrays.

The software NIC's burst kernel takes a message's ACL class from its topic_key row (the
class of its receivers). A publisher's class (``[pm.acl_classes.NAME]`` of its identity,
docs/offload.md "Content ACLs") is applied by the appliance at ingress, per message, with
this kernel: the same ACL stage walk (``_kernels._acl``) over the same arrays of the same
snapshot, for a class the caller names.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nic_offload.model import AclAction
from nic_offload.softnic._kernels import _acl
from nic_offload.softnic.tables import SoftTables

SHORT_PAYLOAD = -1
"""``verdict``'s answer for a payload that ends before the last ACL field (rejected)."""
_REJECT = int(AclAction.REJECT)


@njit(cache=True, nogil=True)
def _verdict(buf, payload_offset, payload_len, acl_class, class_root, groups, bound_lo,  # noqa: ANN001, ANN202
             bound_result, fields_end):  # noqa: ANN001
    if payload_len < fields_end:
        return SHORT_PAYLOAD
    if acl_class < 0 or acl_class >= class_root.shape[0]:
        return _REJECT
    return _acl(buf, payload_offset, class_root[acl_class], groups, bound_lo, bound_result)


def verdict(buf: np.ndarray, payload_offset: int, payload_len: int, acl_class: int,
            tables: SoftTables) -> int:
    """``AclAction`` (ACCEPT, REJECT, LOG) of class ``acl_class`` for the payload at
    ``buf[payload_offset:payload_offset + payload_len]``, or ``SHORT_PAYLOAD``. A class the
    tables do not define rejects (its root is REJECT)."""
    return int(_verdict(buf, payload_offset, payload_len, acl_class, tables.class_root,
                        tables.groups, tables.bound_lo, tables.bound_result,
                        tables.fields_end))


def warm_up() -> None:
    """Compile ``_verdict`` for the argument types the data path passes (a receive buffer,
    a snapshot's read-only ACL arrays): ``topicwire warm`` calls it."""
    from datapath.topics.registry import KeyRegistry
    from nic_offload.compiler import OffloadCompiler
    from nic_offload.schema import Schema

    compiler = OffloadCompiler(KeyRegistry())
    compiler.define_schema(Schema.of("warm", 1, [("price", 0, "u32")]))
    compiler.define_acl_class(1, "warm", ["(price < 10, ACCEPT, REJECT)"])
    verdict(np.zeros(64, np.uint8), 0, 16, 1, compiler.build().tables)
