"""KeyRegistry: stable derived keys, collisions refused, versioned deltas, checked persistence."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from datapath.config import REGISTRY_FILE_FORMAT_VERSION
from datapath.errors import DeviceError, UserError
from datapath.protocol.admin_layout import RegistryEntry
from datapath.topics.algebra import TopicError
from datapath.topics.registry import (
    NO_KEY,
    ZERO_HASH_KEY,
    KeyRegistry,
    RegistryError,
    RegistryRecord,
    topic_key_hash,
)

REPO = Path(__file__).resolve().parents[3]
TOPICS = ["us/nyse/AAPL/bid", "us/nyse/AAPL/ask", "eu/lse/VOD/last", "a//b", "é/ü"]


def by_length(namespace_id, topic):
    """A tiny hash that collides on purpose: topics of equal length share a key."""
    return len(topic)


def test_keys_are_the_documented_blake2b_and_never_change():
    # golden values: a change here changes every key in every deployed registry
    assert topic_key_hash(0, "us/nyse/AAPL/bid") == 0x027B108E193CE39D
    assert topic_key_hash(7, "us/nyse/AAPL/bid") == 0x591B524ECF812A8B
    assert topic_key_hash(0, "é/ü") == 0x1430035B19468C6B
    registry = KeyRegistry()
    assert registry.key_for("us/nyse/AAPL/bid") == 0x027B108E193CE39D
    assert registry.key_for("us/nyse/AAPL/bid", namespace=7) == 0x591B524ECF812A8B


def test_key_for_assigns_once_and_bumps_the_version_per_new_topic():
    registry = KeyRegistry()
    assert registry.version == 0 and len(registry) == 0
    keys = [registry.key_for(t) for t in TOPICS]
    assert registry.version == len(TOPICS)
    assert [registry.key_for(t) for t in TOPICS] == keys  # no change, no new version
    assert registry.version == len(TOPICS) and len(registry) == len(TOPICS)
    assert len(set(keys)) == len(keys) and NO_KEY not in keys
    for topic, key in zip(TOPICS, keys):
        assert registry.get(topic) == key
        assert registry.lookup(key) == (0, topic)
    assert registry.get("not/registered") is None
    assert registry.lookup(12345) is None
    assert [(r.topic, r.topic_key, r.version) for r in registry.entries()] == [
        (t, k, v) for v, (t, k) in enumerate(zip(TOPICS, keys), start=1)
    ]


def test_namespaces_give_different_keys():
    registry = KeyRegistry()
    k0 = registry.key_for("a/b", namespace=0)
    k1 = registry.key_for("a/b", namespace=1)
    assert k0 != k1
    assert registry.lookup(k1) == (1, "a/b")
    assert registry.get("a/b", namespace=2) is None


def test_refuses_patterns_and_bad_namespaces():
    registry = KeyRegistry()
    with pytest.raises(TopicError):
        registry.key_for("a/+/b")
    with pytest.raises(RegistryError, match="registry: refused namespace -1"):
        registry.key_for("a", namespace=-1)
    with pytest.raises(RegistryError, match="refused namespace 4294967296"):
        registry.key_for("a", namespace=1 << 32)
    assert len(registry) == 0 and registry.version == 0


def test_a_collision_is_refused_naming_both_topics():
    registry = KeyRegistry(hash_fn=by_length)
    assert registry.key_for("ab") == 2
    with pytest.raises(RegistryError) as refused:
        registry.key_for("cd")
    message = str(refused.value)
    assert message.startswith("registry: refused topic 'cd' in namespace 0")
    assert "'ab'" in message and "collision" in message and "rename" in message
    assert isinstance(refused.value, UserError)
    assert registry.get("cd") is None and len(registry) == 1 and registry.version == 1


def test_hash_zero_is_mapped_away_from_the_reserved_key():
    registry = KeyRegistry(hash_fn=lambda ns, topic: 0 if topic == "zero" else 1)
    assert registry.key_for("zero") == ZERO_HASH_KEY != NO_KEY
    with pytest.raises(RegistryError, match="'zero'"):
        registry.key_for("one")  # hashes to 1, the key "zero" was given


def test_updates_since_returns_what_a_replica_misses():
    registry = KeyRegistry()
    for topic in TOPICS:
        registry.key_for(topic)
    assert [r.topic for r in registry.updates_since(0)] == TOPICS
    assert [r.topic for r in registry.updates_since(3)] == TOPICS[3:]
    assert registry.updates_since(registry.version) == []
    with pytest.raises(RegistryError, match="ahead of its source"):
        registry.updates_since(registry.version + 1)


def test_merge_adds_only_new_entries_from_records_tuples_and_protocol_entries():
    source = KeyRegistry()
    for topic in TOPICS:
        source.key_for(topic)
    replica = KeyRegistry()
    replica.key_for(TOPICS[0])
    added = replica.merge(source.updates_since(0))
    assert [r.topic for r in added] == TOPICS[1:]
    assert {(r.namespace_id, r.topic, r.topic_key) for r in replica.entries()} == {
        (r.namespace_id, r.topic, r.topic_key) for r in source.entries()
    }
    assert replica.merge(source.entries()) == []  # idempotent
    version = replica.version
    key = topic_key_hash(3, "x/y")
    new = replica.merge([
        RegistryEntry(topic_key=key, namespace_id=3, topic="x/y"),
        (3, "p", topic_key_hash(3, "p")),
    ])
    assert [(r.topic, r.version) for r in new] == [("x/y", version + 1), ("p", version + 2)]
    assert replica.get("x/y", 3) == key


def test_merge_is_all_or_nothing():
    registry = KeyRegistry()
    good = (0, "a", topic_key_hash(0, "a"))
    bad = (0, "b", topic_key_hash(0, "b") ^ 1)
    refusal = "merge entry 1: key .* does not match the key of topic 'b'"
    with pytest.raises(RegistryError, match=refusal):
        registry.merge([good, bad])
    assert len(registry) == 0 and registry.version == 0
    colliding = KeyRegistry(hash_fn=by_length)
    with pytest.raises(RegistryError, match="'xy'.*'ab'|'ab'.*'xy'"):
        colliding.merge([(0, "ab", 2), (0, "xy", 2)])
    assert len(colliding) == 0


def test_save_then_load_gives_the_same_registry(tmp_path):
    registry = KeyRegistry()
    for topic in TOPICS:
        registry.key_for(topic)
    registry.key_for("ns/topic", namespace=9)
    path = tmp_path / "registry.json"
    registry.save(path)
    assert os.listdir(tmp_path) == ["registry.json"]  # no temp file left behind
    document = json.loads(path.read_text(encoding="utf-8"))
    assert document["format_version"] == REGISTRY_FILE_FORMAT_VERSION
    loaded = KeyRegistry.load(path)
    assert loaded.entries() == registry.entries()
    assert loaded.version == registry.version
    assert [loaded.key_for(t) for t in TOPICS] == [registry.get(t) for t in TOPICS]
    assert loaded.version == registry.version  # nothing new was assigned
    assert loaded.updates_since(5) == registry.updates_since(5)
    loaded.key_for("later")
    loaded.save(path)  # replaces the file
    assert KeyRegistry.load(path).get("later") == topic_key_hash(0, "later")


def test_keys_are_the_same_in_another_process(tmp_path):
    registry = KeyRegistry()
    for topic in TOPICS:
        registry.key_for(topic, namespace=4)
    path = tmp_path / "registry.json"
    registry.save(path)
    script = (
        "import json, sys\n"
        "from datapath.topics.registry import KeyRegistry\n"
        "loaded = KeyRegistry.load(sys.argv[1])\n"
        "fresh = KeyRegistry()\n"
        "topics = json.loads(sys.argv[2])\n"
        "print(json.dumps({'loaded': [loaded.get(t, 4) for t in topics],\n"
        "                  'fresh': [fresh.key_for(t, 4) for t in topics],\n"
        "                  'version': loaded.version}))\n"
    )
    for seed in ("1", "12345"):  # Python's own str hash differs per seed; keys must not
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO))
        out = subprocess.run(
            [sys.executable, "-c", script, str(path), json.dumps(TOPICS)],
            capture_output=True, text=True, env=env, cwd=tmp_path, check=True,
        )
        other = json.loads(out.stdout)
        expected = [registry.get(t, 4) for t in TOPICS]
        assert other == {"loaded": expected, "fresh": expected, "version": registry.version}


def test_a_failed_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "registry.json"
    registry = KeyRegistry()
    registry.key_for("a")
    registry.save(path)
    before = path.read_bytes()
    registry.key_for("b")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    refusal = "registry: cannot write registry file .*No space left"
    with pytest.raises(DeviceError, match=refusal) as failed:
        registry.save(path)
    assert failed.value.errno == 28
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["registry.json"]


def test_save_into_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(DeviceError, match="exists and is writable"):
        KeyRegistry().save(tmp_path / "missing" / "registry.json")


def write(path, document):
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def good_document(*topics, hash_fn=topic_key_hash):
    entries = [
        {"version": v, "namespace_id": 0, "key": f"{hash_fn(0, t):#018x}", "topic": t}
        for v, t in enumerate(topics, start=1)
    ]
    return {"kind": "topicwire.key-registry", "format_version": REGISTRY_FILE_FORMAT_VERSION,
            "version": len(entries), "entries": entries}


def test_load_accepts_a_hand_written_file(tmp_path):
    path = write(tmp_path / "r.json", good_document("a", "b/c"))
    assert KeyRegistry.load(path).get("b/c") == topic_key_hash(0, "b/c")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(format_version=REGISTRY_FILE_FORMAT_VERSION + 1),
         "has format version 2, this topicwire reads version 1"),
        (lambda d: d["entries"][1].update(key=d["entries"][0]["key"]),
         "entry 1 of registry file .*: key 0x[0-9a-f]{16} does not match the key of topic 'b/c'"),
        (lambda d: d["entries"][1].update(key="zz"), "entry 1 .* is not a hex string"),
        (lambda d: d["entries"].append(dict(d["entries"][0], version=3)),
         "entry 2 .* topic 'a' in namespace 0 is listed twice"),
        (lambda d: d["entries"][1].update(version=1),
         "entry 1 .* version 1 is not an integer above"),
        (lambda d: d["entries"][0].update(topic="a/#"), "refused entry 0 .*'a/#'"),
        (lambda d: d.update(version=1), "its version 1 is below its last entry's version 2"),
        (lambda d: d.pop("kind"), "is not a topicwire key registry file"),
        (lambda d: d.update(entries={}), "is malformed"),
    ],
)
def test_load_refuses_a_damaged_file_naming_it(tmp_path, mutate, expected):
    document = good_document("a", "b/c")
    mutate(document)
    path = write(tmp_path / "damaged.json", document)
    with pytest.raises(RegistryError, match=expected) as refused:
        KeyRegistry.load(path)
    message = str(refused.value)
    assert message.startswith("registry: ") and str(path) in message


def test_load_refuses_duplicate_keys(tmp_path):
    path = write(tmp_path / "dup.json", good_document("ab", "cd", hash_fn=by_length))
    with pytest.raises(RegistryError, match="key 0x0000000000000002 of topic 'cd'.*also the key "
                                            "of topic 'ab'.*duplicate key.*rename") as refused:
        KeyRegistry.load(path, hash_fn=by_length)
    assert str(path) in str(refused.value)


def test_load_refuses_corrupt_json_and_missing_files(tmp_path):
    path = tmp_path / "corrupt.json"
    path.write_text('{"kind": "topicwire.key-registry", "entries": [', encoding="utf-8")
    with pytest.raises(RegistryError, match=r"corrupt.json' is not valid JSON \(line 1"):
        KeyRegistry.load(path)
    with pytest.raises(RegistryError, match="cannot read registry file .*missing.json"):
        KeyRegistry.load(tmp_path / "missing.json")


def test_records_are_plain_values():
    record = RegistryRecord(namespace_id=1, topic="a", topic_key=5, version=2)
    assert record == RegistryRecord(1, "a", 5, 2)
    with pytest.raises(AttributeError):
        record.topic = "b"


def test_register_many_refuses_each_bad_name_alone_and_adds_the_rest():
    registry = KeyRegistry(hash_fn=lambda ns, topic: 7 if topic.startswith("clash") else
                           topic_key_hash(ns, topic))
    registry.key_for("old/one")
    out = registry.register_many([(0, "a/b"), (0, "a/+"), (0, "old/one"), (2**32, "x"),
                                  (0, "clash/1"), (0, "clash/2"), (1, "a/b")])
    assert [type(o).__name__ for o in out] == ["RegistryRecord", "RegistryError",
                                              "RegistryRecord", "RegistryError",
                                              "RegistryRecord", "RegistryError",
                                              "RegistryRecord"]
    assert "clash/1" in str(out[5]) and "collision" in str(out[5])
    assert out[2].version == 1  # the record it had
    assert registry.version == 4 and len(registry) == 4
    assert registry.get("a/b", 1) == topic_key_hash(1, "a/b")
    assert registry.updates_since(1) == [out[0], out[4], out[6]]
    # checked=True: the caller's keys and topic checks are taken as they are
    more = registry.register_many([(0, "c/d", registry.key_of("c/d"))], checked=True)
    assert more[0].topic_key == topic_key_hash(0, "c/d") and registry.version == 5
