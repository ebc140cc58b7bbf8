"""The small table snapshot the P4 golden files and the BMv2 test share.

Seven keys, one per key action and ACL case, two multicast groups, and ACL classes 1 and 2
compiled by nic_offload.acl from rules over the four default ACL fields:

    key     action                          ACL
    0x1001  forward(port 1)                 none
    0x1002  forward_group(group 1 -> 2, 3)  none
    0x1003  drop
    0x1004  punt                            (digest PUNT)
    0x1005  forward(port 4, class 1)        class 1
    0x1006  forward_group(group 2 -> 5, 6)  class 1
    0x1007  forward(port 3, class 2)        class 2
    (other) miss: punt                      (digest UNKNOWN_KEY)

Class 1: ``symbol == 'IBM' and price < 5000`` accepts; else ``price >= 100000`` logs; else
reject (decided in stages 0 and 1). Class 2: ``venue == 7`` accepts, else reject (stages 0..2
pass through with acl_next, stage 3 decides: the whole chain runs).
"""

from __future__ import annotations

from nic_offload import model
from nic_offload.acl import AclClass, compile_class
from nic_offload.model import (
    DEFAULT_SPEC,
    EntrySet,
    Exact,
    MulticastGroup,
    TableEntry,
    key_rows_from_entries,
)
from nic_offload.schema import Schema

QUOTE = Schema.of("quote", 7, [("symbol", 0, "ascii", 4), ("price", 4, "u32"),
                               ("size", 8, "i32"), ("venue", 12, "u32")])
RULES = ("(symbol == 'IBM' and price < 5000, ACCEPT, CONTINUE)",
         "(price >= 100000, LOG, REJECT)")
ACL_CLASS = 1
VENUE_RULES = ("(venue == 7, ACCEPT, REJECT)",)
VENUE_CLASS = 2

KEYS = {  # key -> (action, params)
    0x1001: (model.ACTION_FORWARD, {"egress_port": 1, "acl_class": 0}),
    0x1002: (model.ACTION_FORWARD_GROUP, {"group": 1, "acl_class": 0}),
    0x1003: (model.ACTION_DROP, {}),
    0x1004: (model.ACTION_PUNT, {}),
    0x1005: (model.ACTION_FORWARD, {"egress_port": 4, "acl_class": ACL_CLASS}),
    0x1006: (model.ACTION_FORWARD_GROUP, {"group": 2, "acl_class": ACL_CLASS}),
    0x1007: (model.ACTION_FORWARD, {"egress_port": 3, "acl_class": VENUE_CLASS}),
}
GROUPS = (MulticastGroup(1, (2, 3)), MulticastGroup(2, (5, 6)))
VERSION = 7


def entry_set() -> EntrySet:
    """The snapshot, validated."""
    keys = [TableEntry.make(model.TOPIC_KEY_TABLE, {model.TOPIC_KEY_FIELD: Exact(key)},
                            action, params) for key, (action, params) in KEYS.items()]
    acl = [*compile_class(AclClass.parse(ACL_CLASS, QUOTE, RULES), DEFAULT_SPEC),
           *compile_class(AclClass.parse(VENUE_CLASS, QUOTE, VENUE_RULES), DEFAULT_SPEC)]
    entries = EntrySet(DEFAULT_SPEC, key_rows_from_entries(keys), tuple(acl), GROUPS, VERSION)
    entries.validate()
    return entries
