"""``[cache]`` is checked like every other table: a bad value is a ``ConfigError`` naming the
key, in one line; a good table gives the settings the logs are opened with."""

from __future__ import annotations

import pytest

from appliance.config import ConfigError, parse_config

HEAD = {"appliance": {"name": "core1"}, "clients": {"udp": "127.0.0.1:47999"}}


def _cfg(tmp_path, cache, clients=True):
    doc = dict(HEAD, cache={"dir": str(tmp_path / "c"), "patterns": ["orders/#"], **cache})
    if not clients:
        del doc["clients"]
    return parse_config(doc)


@pytest.mark.parametrize("cache, key", [
    ({"fsync": "sometimes"}, "cache.fsync"),
    ({"fsync": 1}, "cache.fsync"),
    ({"fsync": "interval", "fsync_interval_ms": 0}, "cache.fsync_interval_ms"),
    ({"fsync_interval_ms": 5}, "cache.fsync_interval_ms"),  # only with "interval"
    ({"patterns": []}, "cache.patterns"),
    ({"patterns": "orders/#"}, "cache.patterns"),
    ({"patterns": ["a/b#"]}, "cache.patterns"),
    ({"patterns": ["a/#", "a/#"]}, "cache.patterns"),
    ({"patterns": [f"p{i}/#" for i in range(65)]}, "cache.patterns"),
    ({"dir": ""}, "cache.dir"),
    ({"dir": "/proc/topicwire"}, "cache.dir"),
    ({"retention_bytes": -1}, "cache.retention_bytes"),
    ({"retention_bytes": 1000}, "cache.retention_bytes"),  # below four 1 MiB segments
    ({"retention_hours": True}, "cache.retention_hours"),
    ({"size": 1}, "cache.size"),
    ({"acknowledge": "synced"}, "cache.acknowledge"),
    ({"acknowledge": True}, "cache.acknowledge"),
    ({"max_disk_bytes": -1}, "cache.max_disk_bytes"),
    ({"max_disk_bytes": "8G"}, "cache.max_disk_bytes"),
    ({"max_disk_bytes": 1 << 20}, "cache.max_disk_bytes"),  # below 4 MiB per pattern
    ({"patterns": ["a/#", "b/#"], "max_disk_bytes": 6 << 20}, "cache.max_disk_bytes"),
])
def test_a_bad_cache_value_is_refused_naming_its_key(tmp_path, cache, key):
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, cache)
    assert str(info.value).startswith(f"config: {key}: "), str(info.value)
    assert "\n" not in str(info.value)


def test_a_cache_needs_a_client_endpoint_and_patterns(tmp_path):
    with pytest.raises(ConfigError, match="^config: cache: needs clients.udp or clients.shm"):
        _cfg(tmp_path, {}, clients=False)
    with pytest.raises(ConfigError, match="^config: cache.patterns: required"):
        parse_config(dict(HEAD, cache={"dir": str(tmp_path)}))


def test_a_good_cache_table_gives_the_log_settings(tmp_path):
    cfg = _cfg(tmp_path, {"fsync": "interval", "fsync_interval_ms": 20,
                          "retention_bytes": 64 << 20, "retention_hours": 2})
    log = cfg.cache.log_config()
    assert (log.fsync, log.fsync_interval_ms) == ("interval", 20)
    assert log.retention_max_bytes == 64 << 20 and log.segment_bytes == 16 << 20
    assert log.retention_max_age_ms == 2 * 3_600_000
    assert cfg.cache.acknowledge == "received"
    assert _cfg(tmp_path, {"acknowledge": "persisted"}).cache.acknowledge == "persisted"
    assert parse_config(HEAD).cache is None


def test_the_disk_bound_sizes_the_segments_so_the_newest_ones_stay_under_it(tmp_path):
    cfg = _cfg(tmp_path, {"patterns": ["a/#", "b/#"], "max_disk_bytes": 64 << 20})
    assert cfg.cache.max_disk_bytes == 64 << 20
    assert cfg.cache.log_config().segment_bytes == 8 << 20  # a quarter of each one's share
    assert _cfg(tmp_path, {}).cache.max_disk_bytes == 0


def test_topicwire_run_refuses_a_bad_disk_bound_in_one_line_with_exit_2(tmp_path):
    import subprocess

    from tests.appliance.helpers import CLI, ROOT

    config = tmp_path / "bad.toml"
    config.write_text(f"""[appliance]\nname = "c1"\n[clients]\nudp = "127.0.0.1:47999"\n
[cache]\ndir = "{tmp_path / 'c'}"\npatterns = ["orders/#"]\nmax_disk_bytes = 1000\n""")
    run = subprocess.run([*CLI, "run", "--config", str(config)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "cache.max_disk_bytes: must be 0 (no limit) or at least" in \
        lines[0], run.stderr


def _remote(cache, neighbours=("core2",)):
    return parse_config(dict(
        HEAD, fabric={"listen": "127.0.0.1:47998", "key": "ab" * 32},
        neighbours=[{"name": n, "address": "127.0.0.1:47997"} for n in neighbours],
        cache=cache))


@pytest.mark.parametrize("cache, key, words", [
    ({"remote": "core2"}, "cache.acknowledge", "must be \"persisted\" with cache.remote"),
    ({"remote": "core2", "acknowledge": "received"}, "cache.acknowledge", "not 'received'"),
    ({"remote": "", "acknowledge": "persisted"}, "cache.remote", "the name of a neighbour"),
    ({"remote": 7, "acknowledge": "persisted"}, "cache.remote", "the name of a neighbour"),
    ({"remote": "core3", "acknowledge": "persisted"}, "cache.remote",
     "must name one of [[neighbours]] (core2), not 'core3'"),
    ({"remote": "core2", "acknowledge": "persisted", "dir": "/tmp/x"}, "cache.dir",
     "not with cache.remote"),
    ({"remote": "core2", "acknowledge": "persisted", "patterns": ["a/#"]}, "cache.patterns",
     "not with cache.remote"),
])
def test_a_bad_remote_cache_value_is_refused_naming_its_key(cache, key, words):
    with pytest.raises(ConfigError) as info:
        _remote(cache)
    text = str(info.value)
    assert text.startswith(f"config: {key}: ") and words in text, text
    assert "\n" not in text


@pytest.mark.parametrize("cache, key, words", [
    ({"serve_from": ""}, "cache.serve_from", "the name of a neighbour with a [cache]"),
    ({"serve_from": 7}, "cache.serve_from", "the name of a neighbour with a [cache]"),
    ({"serve_from": "core3"}, "cache.serve_from",
     "must name one of [[neighbours]] (core2), not 'core3'"),
    ({"serve_from": "core2", "acknowledge": "persisted"}, "cache.acknowledge",
     "not with cache.serve_from alone"),
    ({"serve_from": "core2", "fsync": "batch"}, "cache.fsync",
     "not with cache.serve_from alone"),
    ({"dir": "/tmp", "patterns": ["a/#"], "serve_from": "core9"}, "cache.serve_from",
     "must name one of [[neighbours]]"),
])
def test_a_bad_serve_from_value_is_refused_naming_its_key(cache, key, words):
    with pytest.raises(ConfigError) as info:
        _remote(cache)
    text = str(info.value)
    assert text.startswith(f"config: {key}: ") and words in text, text
    assert "\n" not in text


def test_serve_from_alone_beside_remote_or_beside_a_cache_of_its_own(tmp_path):
    cfg = _remote({"serve_from": "core2"})
    assert cfg.cache is None and cfg.persist_remote is None
    assert cfg.cache_serve_from == "core2"
    cfg = _remote({"remote": "core2", "acknowledge": "persisted"})  # remote implies it
    assert cfg.cache_serve_from == "core2"
    cfg = _remote({"dir": str(tmp_path), "patterns": ["a/#"], "serve_from": "core2"})
    assert cfg.cache is not None and cfg.cache_serve_from == "core2"
    assert parse_config(dict(HEAD)).cache_serve_from is None


def test_a_remote_cache_runs_without_a_cache_of_its_own():
    cfg = _remote({"remote": "core2", "acknowledge": "persisted"})
    assert cfg.cache is None and cfg.persist_remote == "core2"
    assert parse_config(dict(HEAD)).persist_remote is None
