"""Topic-key registry: (namespace, concrete topic) -> 64-bit key, the only name frames carry.

P&M holds the authoritative registry and pushes it to appliances (REGISTRY_UPDATE admin
frames carry ``topic_key``, ``namespace_id`` and the topic). A key is *derived*, not
allocated: ``blake2b(digest_size=8, person=b"topicwire-key-v1")`` over the namespace as 4
big-endian bytes followed by the UTF-8 topic, read as a big-endian unsigned integer. So every
process, restart and machine computes the same key for the same topic, and a registry file is
checked on load by recomputing every key. Key 0 is reserved ("no key / unknown"): a hash of 0
becomes key 1. Two names with one key (a 64-bit collision, about 1 in 3.7e7 at 1M topics) are
refused, naming both topics; the cure is to rename one.

Every added entry increments ``version`` by one and remembers it, so ``updates_since(v)`` is
the delta a replica at version ``v`` is missing. File format: docs/registry.md.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datapath.config import REGISTRY_FILE_FORMAT_VERSION
from datapath.errors import DeviceError, UserError
from datapath.topics.algebra import split_topic

NO_KEY = 0
"""Reserved key: no key / unknown topic."""

ZERO_HASH_KEY = 1
"""The key a topic gets when its hash is 0 (``NO_KEY`` is reserved)."""

KEY_MASK = (1 << 64) - 1
NAMESPACE_MAX = (1 << 32) - 1
"""Namespaces are u32 on the wire (message header and REGISTRY_UPDATE entries)."""

KEY_PERSON = b"topicwire-key-v1"
"""blake2b personalisation: changing it changes every key (a new key scheme, not a tunable)."""

FILE_KIND = "topicwire.key-registry"

HashFn = Callable[[int, str], int]
"""``(namespace_id, topic) -> unsigned 64-bit hash``; the registry maps 0 to ``ZERO_HASH_KEY``."""


class RegistryError(UserError):
    """A refused registry operation or registry file."""

    component = "registry"


def topic_key_hash(namespace_id: int, topic: str) -> int:
    """The stable 64-bit hash of a (namespace, topic): the same in every process and machine."""
    data = namespace_id.to_bytes(4, "big") + topic.encode("utf-8")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=KEY_PERSON).digest(), "big")


@dataclass(frozen=True, slots=True)
class RegistryRecord:
    """One registered topic: its namespace, topic, key and the registry version that added it."""

    namespace_id: int
    topic: str
    topic_key: int
    version: int


def _check_namespace(namespace_id: object) -> int:
    if type(namespace_id) is not int or not 0 <= namespace_id <= NAMESPACE_MAX:
        raise RegistryError(
            f"refused namespace {_brief(namespace_id)}; give an integer from 0 to {NAMESPACE_MAX}"
        )
    return namespace_id


def _brief(value: object) -> str:
    """A value read from a file or a frame, for a message: a scalar quoted (cut at 60
    characters), a container by its kind (one nested deeply is too deep to print)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:60]) + "..."
    return repr(value)


def _name(namespace_id: int, topic: str) -> str:
    return f"topic {topic!r} in namespace {namespace_id}"


class KeyRegistry:
    """The (namespace, topic) <-> key map with a change log; see the module docstring.

    ``hash_fn`` exists for tests (forcing collisions); a registry written with one hash
    function only loads with the same one.
    """

    def __init__(self, hash_fn: HashFn = topic_key_hash) -> None:
        self._hash_fn = hash_fn
        self._by_name: dict[tuple[int, str], RegistryRecord] = {}
        self._by_key: dict[int, RegistryRecord] = {}
        self._log: list[RegistryRecord] = []  # in version order
        self._version = 0

    # --- keys ----------------------------------------------------------------------------------
    def key_of(self, topic: str, namespace: int = 0) -> int:
        """The key ``topic`` has or would get (pure: registers nothing, checks no collision)."""
        key = self._hash_fn(namespace, topic) & KEY_MASK
        return key if key != NO_KEY else ZERO_HASH_KEY

    def key_for(self, topic: str, namespace: int = 0) -> int:
        """The key of ``topic`` in ``namespace``, registering it on first use."""
        record = self._by_name.get((namespace, topic))
        if record is not None:
            return record.topic_key
        _check_namespace(namespace)
        split_topic(topic)  # a concrete topic only: raises TopicError otherwise
        key = self.key_of(topic, namespace)
        self._refuse_collision(namespace, topic, key, self._by_key.get(key))
        return self._append(namespace, topic, key).topic_key

    def get(self, topic: str, namespace: int = 0) -> int | None:
        """The key of a registered topic, or None."""
        record = self._by_name.get((namespace, topic))
        return None if record is None else record.topic_key

    def lookup(self, key: int) -> tuple[int, str] | None:
        """``(namespace_id, topic)`` of a registered key, or None."""
        record = self._by_key.get(key)
        return None if record is None else (record.namespace_id, record.topic)

    @property
    def version(self) -> int:
        """Registry version: 0 when empty, +1 per added entry."""
        return self._version

    def entries(self) -> list[RegistryRecord]:
        """Every record, in version order."""
        return list(self._log)

    def __len__(self) -> int:
        return len(self._log)

    def __contains__(self, name: object) -> bool:
        """``(namespace_id, topic) in registry``."""
        return name in self._by_name

    def updates_since(self, version: int) -> list[RegistryRecord]:
        """The records added after ``version`` (what a replica at ``version`` is missing)."""
        if type(version) is not int or not 0 <= version <= self._version:
            raise RegistryError(
                f"refused updates since version {version!r}: this registry is at version "
                f"{self._version}; a replica ahead of its source must reload a full snapshot "
                "(entries())"
            )
        start = bisect.bisect_right(self._log, version, key=lambda record: record.version)
        return self._log[start:]

    def merge(self, entries: Iterable[Any]) -> list[RegistryRecord]:
        """Add entries received from another registry; returns the records that were new.

        An entry is a ``(namespace_id, topic, topic_key)`` tuple or anything with those
        attributes (``RegistryRecord``, the protocol's ``admin_layout.RegistryEntry``). Every
        key must equal this registry's key of its topic. All or nothing: on any refusal nothing
        is added. New records get this registry's next versions, in input order.
        """
        new: dict[tuple[int, str], int] = {}
        new_keys: dict[int, tuple[int, str]] = {}
        for index, entry in enumerate(entries):
            where = f"merge entry {index}"
            try:
                if isinstance(entry, tuple):
                    namespace_id, topic, key = entry
                else:
                    namespace_id, topic, key = entry.namespace_id, entry.topic, entry.topic_key
            except (ValueError, AttributeError) as exc:
                raise RegistryError(
                    f"refused {where} {_brief(entry)}: give (namespace_id, topic, topic_key) "
                    "tuples or registry records"
                ) from exc
            namespace_id, topic, key = self._check_entry(namespace_id, topic, key, where)
            name = (namespace_id, topic)
            existing = self._by_name.get(name)
            if existing is not None or name in new:
                continue
            self._refuse_collision(namespace_id, topic, key, self._by_key.get(key))
            other = new_keys.get(key)
            if other is not None:
                raise RegistryError(
                    f"refused {where}: {_name(namespace_id, topic)} has key {key:#018x}, the key "
                    f"of {_name(*other)} earlier in the same merge (a hash collision); rename one "
                    "of the two topics"
                )
            new[name] = key
            new_keys[key] = name
        return [self._append(ns, topic, key) for (ns, topic), key in new.items()]

    def register_many(self, names: Iterable[tuple[int, str]] | Iterable[tuple[int, str, int]],
                      *, checked: bool = False) -> list[RegistryRecord | RegistryError]:
        """Register each ``(namespace_id, topic)``, one outcome per name in input order: its
        record (new, or the one it had), or the ``RegistryError`` that refused it alone (an
        invalid namespace or topic, a hash collision with a registered topic or with an
        earlier name of the same call); the others are added all the same. A batch of
        100,000 topics costs one pass (a client's batched registration, issue 19).
        ``checked``: the names are ``(namespace_id, topic, key)`` whose topic the caller
        validated (``split_topic``) and whose key it took from ``key_of``: neither is done
        again."""
        out: list[RegistryRecord | RegistryError] = []
        by_name, by_key = self._by_name, self._by_key
        hash_fn = self._hash_fn
        for name in names:
            namespace_id, topic = name[0], name[1]
            record = by_name.get((namespace_id, topic))
            if record is None:
                try:
                    _check_namespace(namespace_id)
                    if checked:
                        key = name[2]  # type: ignore[misc]
                    else:
                        split_topic(topic)
                        key = hash_fn(namespace_id, topic) & KEY_MASK
                        if key == NO_KEY:
                            key = ZERO_HASH_KEY
                    self._refuse_collision(namespace_id, topic, key, by_key.get(key))
                except UserError as exc:
                    out.append(exc if isinstance(exc, RegistryError)
                               else RegistryError(str(exc)))
                    continue
                record = self._append(namespace_id, topic, key)
            out.append(record)
        return out

    def record_of(self, topic: str, namespace: int = 0) -> RegistryRecord | None:
        """The record of a registered topic, or None."""
        return self._by_name.get((namespace, topic))

    # --- persistence ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the registry as JSON, atomically (temp file, fsync, rename, fsync the dir)."""
        path = Path(path)
        document = {
            "kind": FILE_KIND,
            "format_version": REGISTRY_FILE_FORMAT_VERSION,
            "version": self._version,
            "entries": [
                {
                    "version": r.version,
                    "namespace_id": r.namespace_id,
                    "key": f"{r.topic_key:#018x}",
                    "topic": r.topic,
                }
                for r in self._log
            ],
        }
        directory = path.parent
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise DeviceError(
                f"cannot write registry file {str(path)!r}: {exc.strerror}; check that "
                f"{str(directory)!r} exists and is writable",
                errno=exc.errno,
                component="registry",
            ) from exc
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                os.fchmod(out.fileno(), 0o644)
                json.dump(document, out, ensure_ascii=False, indent=1)
                out.write("\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp_name, path)
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise DeviceError(
                f"cannot write registry file {str(path)!r}: {exc.strerror}; check free space "
                "and permissions, the previous file (if any) is unchanged",
                errno=exc.errno,
                component="registry",
            ) from exc
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str], hash_fn: HashFn = topic_key_hash) -> KeyRegistry:
        """Read a file written by ``save``, checking every field and every key."""
        path = Path(path)
        shown = repr(str(path))
        fix = "restore it from a backup or re-export the registry from P&M"
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            raise RegistryError(
                f"cannot read registry file {shown}: {exc.strerror}; give the path of a file "
                "written by KeyRegistry.save"
            ) from exc
        except UnicodeDecodeError as exc:
            raise RegistryError(f"registry file {shown} is not UTF-8 text; {fix}") from exc
        except OSError as exc:
            raise DeviceError(
                f"cannot read registry file {shown}: {exc.strerror}; check the disk",
                errno=exc.errno,
                component="registry",
            ) from exc
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RegistryError(
                f"registry file {shown} is not valid JSON (line {exc.lineno}, column "
                f"{exc.colno}: {exc.msg}); {fix}"
            ) from exc
        except RecursionError:  # a registry file is 3 levels deep; the parser recurses per level
            raise RegistryError(f"registry file {shown} is nested too deeply to be a registry "
                                f"file; {fix}") from None
        except ValueError as exc:  # e.g. an integer of more digits than Python converts
            raise RegistryError(f"registry file {shown} is not valid JSON ({exc}); {fix}") \
                from None
        if not isinstance(document, dict) or document.get("kind") != FILE_KIND:
            raise RegistryError(
                f"{shown} is not a topicwire key registry file (no \"kind\": \"{FILE_KIND}\"); "
                "check the path"
            )
        found = document.get("format_version")
        if found != REGISTRY_FILE_FORMAT_VERSION:
            raise RegistryError(
                f"registry file {shown} has format version {_brief(found)}, this topicwire reads "
                f"version {REGISTRY_FILE_FORMAT_VERSION}; load it with the topicwire release "
                "that wrote it, or re-export the registry from P&M"
            )
        file_version = document.get("version")
        entries = document.get("entries")
        if type(file_version) is not int or file_version < 0 or not isinstance(entries, list):
            raise RegistryError(
                f"registry file {shown} is malformed (needs an integer \"version\" >= 0 and a "
                f"list \"entries\"); {fix}"
            )
        registry = cls(hash_fn)
        registry._load_entries(entries, file_version, shown)
        return registry

    def _load_entries(self, entries: list[Any], file_version: int, shown: str) -> None:
        previous = 0
        for index, item in enumerate(entries):
            where = f"entry {index} of registry file {shown}"
            if not isinstance(item, dict) or set(item) != {"version", "namespace_id", "key",
                                                           "topic"}:
                raise RegistryError(
                    f"refused {where}: needs exactly the fields version, namespace_id, key, "
                    "topic; re-export the registry from P&M"
                )
            version, text_key = item["version"], item["key"]
            if type(version) is not int or version <= previous:
                raise RegistryError(
                    f"refused {where}: version {_brief(version)} is not an integer above the "
                    f"previous entry's ({previous}); re-export the registry from P&M"
                )
            try:
                key = int(text_key, 16) if isinstance(text_key, str) else None
            except ValueError:
                key = None
            if key is None:
                raise RegistryError(
                    f"refused {where}: key {_brief(text_key)} is not a hex string like "
                    "\"0x0123456789abcdef\"; re-export the registry from P&M"
                )
            namespace_id, topic, key = self._check_entry(item["namespace_id"], item["topic"],
                                                         key, where)
            name = (namespace_id, topic)
            if name in self._by_name:
                raise RegistryError(
                    f"refused {where}: {_name(*name)} is listed twice; remove one of the two "
                    "entries or re-export the registry from P&M"
                )
            other = self._by_key.get(key)
            if other is not None:
                raise RegistryError(
                    f"refused {where}: key {key:#018x} of {_name(*name)} is also the key of "
                    f"{_name(other.namespace_id, other.topic)} (duplicate key); rename one of "
                    "the two topics and re-export the registry from P&M"
                )
            record = RegistryRecord(namespace_id, topic, key, version)
            self._by_name[name] = record
            self._by_key[key] = record
            self._log.append(record)
            previous = version
        if file_version < previous:
            raise RegistryError(
                f"refused registry file {shown}: its version {file_version} is below its last "
                f"entry's version {previous}; re-export the registry from P&M"
            )
        self._version = file_version

    # --- internals -----------------------------------------------------------------------------
    def _check_entry(self, namespace_id: object, topic: object, key: object,
                     where: str) -> tuple[int, str, int]:
        if type(namespace_id) is not int or not 0 <= namespace_id <= NAMESPACE_MAX:
            raise RegistryError(
                f"refused {where}: namespace {_brief(namespace_id)} is not an integer from 0 to "
                f"{NAMESPACE_MAX}"
            )
        if not isinstance(topic, str):
            raise RegistryError(f"refused {where}: topic {_brief(topic)} is not a string")
        try:
            split_topic(topic)
        except UserError as exc:
            raise RegistryError(f"refused {where}: {exc}") from exc
        expected = self.key_of(topic, namespace_id)
        if key != expected:
            shown = f"{key:#018x}" if isinstance(key, int) else _brief(key)
            raise RegistryError(
                f"refused {where}: key {shown} does not match the key of "
                f"{_name(namespace_id, topic)} ({expected:#018x}); the entry was edited or made "
                "with a different key hash: re-export the registry from P&M"
            )
        return namespace_id, topic, expected

    def _refuse_collision(self, namespace_id: int, topic: str, key: int,
                          holder: RegistryRecord | None) -> None:
        if holder is None or (holder.namespace_id, holder.topic) == (namespace_id, topic):
            return
        raise RegistryError(
            f"refused {_name(namespace_id, topic)}: its key {key:#018x} already belongs to "
            f"{_name(holder.namespace_id, holder.topic)} (a 64-bit hash collision); rename the "
            "new topic (e.g. add or change a level) and register it again"
        )

    def _append(self, namespace_id: int, topic: str, key: int) -> RegistryRecord:
        self._version += 1
        record = RegistryRecord(namespace_id, topic, key, self._version)
        self._by_name[(namespace_id, topic)] = record
        self._by_key[key] = record
        self._log.append(record)
        return record
