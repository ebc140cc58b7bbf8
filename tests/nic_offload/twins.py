"""The software NIC's pure-Python twins (CONVENTIONS.md #4).

They live in ``nic_offload.softnic.twin`` because ``topicwire bench softnic`` runs them as its
``python_twin`` baseline; the tests import them from here.
"""

from nic_offload.softnic.twin import (
    TwinState,
    acl_twin,
    build_key_table_twin,
    decode_twin,
    home_twin,
    lookup_twin,
    messages_from_batch,
    process_twin,
    run_twin,
)

__all__ = [
    "TwinState",
    "acl_twin",
    "build_key_table_twin",
    "decode_twin",
    "home_twin",
    "lookup_twin",
    "messages_from_batch",
    "process_twin",
    "run_twin",
]
