"""Events: what a selector reads from a native message.

A selector is evaluated on an *event*, a mapping from identifier to value. For a message of
the native protocol the event is built once per message by ``message_event``:

- every field of the message's schema (``nic_offload.schema``: late binding by
  ``schema_id``) that the payload holds, under the field's name; a field the payload is too
  short for is absent, so NULL;
- the message header's fields as properties under reserved names (``HEADER_PROPERTIES``):
  ``tw_topic_key``, ``tw_sequence``, ``tw_publish_ts_ns``, ``tw_namespace_id``,
  ``tw_schema_id``, ``tw_qos`` (JMS has ``JMSPriority``, ``JMSTimestamp``... for the same
  purpose);
- application properties given by the caller (a client API's ``publish(..., properties=)``),
  which may not reuse a reserved name or a schema field's name.

A message without a schema (``schema_id`` 0) has only header and application properties.
"""

from __future__ import annotations

from collections.abc import Mapping

from nic_offload.schema import Schema
from nic_offload.selectors.errors import SelectorError

HEADER_PREFIX = "tw_"
"""Prefix of the identifiers reserved for message header fields."""

HEADER_PROPERTIES = ("topic_key", "sequence", "publish_ts_ns", "namespace_id", "schema_id",
                     "qos")
"""Message header fields (datapath.protocol.message_layout) a selector can read, each as
``tw_<name>``."""


def message_event(payload: bytes | memoryview | None = None, schema: Schema | None = None,
                  header: object = None,
                  properties: Mapping[str, object] | None = None) -> dict[str, object]:
    """The event of one message: schema fields of ``payload``, ``header`` fields as ``tw_*``
    properties (a mapping, a numpy record of a message batch, or a ``codec.MessageView``),
    and application ``properties``. Raises SelectorError when two sources give one name."""
    event: dict[str, object] = {}
    if schema is not None and payload is not None:
        event.update(schema.decode(payload))
    if header is not None:
        for name in HEADER_PROPERTIES:
            key = HEADER_PREFIX + name
            if key in event:
                raise SelectorError(f"schema field {key!r} hides the message header property "
                                    f"of that name; rename the field (names starting with "
                                    f"{HEADER_PREFIX!r} are reserved)")
            event[key] = int(_header_value(header, name))  # type: ignore[call-overload]
    for name, value in (properties or {}).items():
        if name.startswith(HEADER_PREFIX) or name in event:
            what = ("a reserved header property name" if name.startswith(HEADER_PREFIX)
                    else f"a field of schema {schema.name!r}" if schema else "taken")
            raise SelectorError(f"application property {name!r} is {what}; rename the "
                                f"property (names starting with {HEADER_PREFIX!r} are "
                                "reserved for message header fields)")
        event[name] = value
    return event


def _header_value(header: object, name: str) -> object:
    if isinstance(header, Mapping) or hasattr(header, "dtype"):
        return header[name]  # type: ignore[index]
    return getattr(header, name)
