"""``[cache] acknowledge = "persisted"`` end to end (docs/fault-tolerance.md, "Acknowledged
once persisted"): a real appliance with ``[cache]`` (real files, real fsync) acknowledges a
local publisher's guaranteed message only once its cache's log holds it on disk; a full disk
(a 2 MiB tmpfs) holds the acknowledgements back, says so, and loses nothing; a SIGKILL of a
``topicwire run`` process loses nothing it acknowledged."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from appliance.cache.layout import decode
from appliance.cache.store import log_dir_name
from appliance.client import ClientError, connect
from appliance.client.outcomes import ACKNOWLEDGED, FAILED, PENDING
from appliance.persistence import StreamLog
from tests.appliance.helpers import free_port, run_appliance, stop, wait_for
from tests.appliance.test_cache_replay import _config, _start

PATTERN = "orders/#"


def _log_rows(cache_dir: Path, upto: int | None = None) -> list[tuple[str, bytes]]:
    """(topic, payload) of the records of the orders/# log (of a copy: opening a log cuts
    a torn tail, which must not touch the appliance's own), up to cache sequence ``upto``."""
    copy = Path(tempfile.mkdtemp(prefix="ack-log-copy-")) / "log"  # not on the small disk
    shutil.copytree(cache_dir / log_dir_name(PATTERN), copy)
    rows = []
    with StreamLog(copy) as log:
        for batch in log.replay(from_seq=1):
            for i, seq in enumerate(batch.seqs.tolist()):
                if upto is not None and seq > upto:
                    break
                env = decode(batch.payload(i))
                rows.append((env[7], env[8]))
    shutil.rmtree(copy.parent)
    return rows


def _durable_seq(app) -> int:
    return app.cache.store.logs[PATTERN].durable_seq


@pytest.mark.parametrize("acknowledge", ["persisted", "received"])
def test_an_acknowledged_message_is_on_disk_when_flush_returns(tmp_path, acknowledge):
    """With a 1.5 s sync interval the difference shows: persisted, flush returns once the
    log's durable sequence covers every message; received, it returns before the sync."""
    port = free_port()
    cache_dir = tmp_path / "cache"
    app = _start(_config(port, cache_dir, fsync="interval", fsync_interval_ms=1_500,
                         acknowledge=acknowledge))
    try:
        url = f"udp://127.0.0.1:{port}"
        with connect(url, "feed") as client:
            sent = []
            outcomes = []
            for i in range(300):
                topic = ("orders/eu/x", "other/z", "orders/us/y")[i % 3]
                payload = f"{topic}:{i}".encode()
                outcomes.append(client.publish(topic, payload, qos="guaranteed"))
                if topic.startswith("orders/"):
                    sent.append((topic, payload))
            started = time.monotonic()
            client.flush(timeout=30)
            took = time.monotonic() - started
            durable = _durable_seq(app)  # read the moment flush returned
            assert all(o.state == ACKNOWLEDGED for o in outcomes)
        if acknowledge == "persisted":
            assert durable >= len(sent), (durable, len(sent))
            assert _log_rows(cache_dir, durable) == sent  # every one, in order, on disk
            assert app.status()["cache"]["acknowledge"] == "persisted"
        else:  # acknowledged on receipt: before the interval's sync
            assert durable < len(sent) and took < 1.5, (durable, took)
    finally:
        app.stop()


def test_a_full_disk_holds_acknowledgements_back_and_loses_nothing(tmp_path, small_disk):
    port = free_port()
    cache_dir = small_disk / "cache"
    app = _start(_config(port, cache_dir, acknowledge="persisted"))
    try:
        url = f"udp://127.0.0.1:{port}"
        payload = bytes(900)
        sent: list[tuple[str, bytes]] = []
        outcomes = []
        with connect(url, "feed") as client:
            refused = None
            for i in range(6_000):  # ~5.6 MB into 2 MiB
                body = f"{i}:".encode() + payload
                try:
                    outcomes.append(client.publish("orders/eu/x", body, qos="guaranteed"))
                except ClientError as exc:  # the sender's window is full: pushed back
                    refused = exc
                    break
                sent.append(("orders/eu/x", body))
                if i % 100 == 99:
                    client.flush()
                    time.sleep(0.002)
            wait_for(lambda: app.status()["cache"]["storage"].startswith("failing"), 30,
                     what="the cache to report its failing storage")
            with pytest.raises(ClientError):
                client.flush(timeout=2)  # what is not on disk is not acknowledged
            acked = [o.state == ACKNOWLEDGED for o in outcomes]
            n_acked = sum(acked)
            assert acked == [True] * n_acked + [False] * (len(acked) - n_acked)  # a prefix
            assert 0 < n_acked < len(sent)
            assert all(o.state == PENDING for o in outcomes[n_acked:])
            status = app.status()
            assert "No space left" in status["cache"]["storage"], status["cache"]
            assert status["counters"]["cache_store_errors_append"] >= 1
            assert status["counters"]["cache_store_failing"] == 1
            rows = _log_rows(cache_dir)
            assert rows[:n_acked] == sent[:n_acked]  # every acknowledged one is in the log
            assert refused is not None or len(sent) == 6_000
            # space returns: the held messages are written, acknowledgements resume
            subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
            wait_for(lambda: all(o.state == ACKNOWLEDGED for o in outcomes), 30,
                     what="every outcome acknowledged once the disk has room")
            client.flush(timeout=10)
        assert app.status()["cache"]["storage"] == "ok"
        assert _log_rows(cache_dir) == sent  # each once, in order
    finally:
        app.stop()


def test_a_message_the_cache_drops_ends_its_publishers_session_instead_of_a_stall(
        tmp_path, small_disk, monkeypatch):
    """A full disk and a full queue (here 100 messages): the cache drops a message, so its
    publisher's acknowledgements could never go on. The appliance ends that publisher's
    session saying why; every outcome is then acknowledged (and in the log) or failed with
    the reason, none left pending."""
    monkeypatch.setattr("appliance.cache.agent.CACHE_QUEUE_MESSAGES", 100)
    port = free_port()
    cache_dir = small_disk / "cache"
    app = _start(_config(port, cache_dir, acknowledge="persisted"))
    try:
        url = f"udp://127.0.0.1:{port}"
        payload = bytes(900)
        sent: list[tuple[str, bytes]] = []
        outcomes = []
        client = connect(url, "feed", reconnect_s=0)
        try:
            for i in range(6_000):  # ~5.6 MB into 2 MiB
                body = f"{i}:".encode() + payload
                try:
                    outcomes.append(client.publish("orders/eu/x", body, qos="guaranteed"))
                except ClientError:  # the window is full, or the session was ended
                    break
                sent.append(("orders/eu/x", body))
                if i % 100 == 99:
                    try:
                        client.flush()
                    except ClientError:  # the session was ended: its outcomes failed
                        break
                    time.sleep(0.002)
            wait_for(lambda: client.logged_out_reason, 30,
                     what="the appliance to end the publisher's session")
            assert "was not persisted by the cache" in client.logged_out_reason
            assert "queue was full" in client.logged_out_reason
            wait_for(lambda: all(o.state != PENDING for o in outcomes), 10,
                     what="no outcome left pending")
            states = [o.state for o in outcomes]
            n_acked = states.count(ACKNOWLEDGED)
            assert states == [ACKNOWLEDGED] * n_acked + [FAILED] * (len(states) - n_acked)
            assert n_acked < len(sent)
            assert "not persisted by the cache" in outcomes[-1].reason
        finally:
            client.close()
        counters = wait_for(lambda: (c := app.status()["counters"]).get(
            "cache_dropped_queue_full") and c, 10, what="the cache's counters")
        assert counters["cache_unkept_reported"] >= 1
        assert counters["guaranteed_persist_failed"] == 1
        assert counters["control_sessions_ended_unpersisted"] == 1
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
        wait_for(lambda: app.status()["cache"]["storage"] == "ok", 30, what="the disk back")
        rows = _log_rows(cache_dir)
        assert rows[:n_acked] == sent[:n_acked]  # every acknowledged one is in the log
    finally:
        app.stop()


def test_a_sigkill_loses_nothing_that_was_acknowledged(tmp_path):
    port = free_port()
    config = tmp_path / "a.toml"
    cache_dir = tmp_path / "cache"
    config.write_text("\n".join([
        "[appliance]", f'name = "ack{port}"', "[clients]", f'udp = "127.0.0.1:{port}"',
        "[pm]", "require_passwords = false",
        "[pm.identities.feed]", 'publish = ["orders/#"]', 'subscribe = ["#"]',
        "[cache]", f'dir = "{cache_dir}"', 'patterns = ["orders/#"]',
        'acknowledge = "persisted"']) + "\n")
    url = f"udp://127.0.0.1:{port}"
    proc = run_appliance(config)
    acked: list[bytes] = []
    lock = threading.Lock()

    def done(outcome, body: bytes) -> None:
        if outcome.state == ACKNOWLEDGED:
            with lock:
                acked.append(body)

    try:
        client = connect(url, "feed", reconnect_s=0)
        # the cache's session subscribes in the background: until then nothing waits for it
        wait_for(lambda: _first_kept(client, cache_dir), 60, interval_s=0.2,
                 what="the cache of topicwire run keeping a message")
        with lock:
            acked.clear()
        published = 0
        try:
            for i in range(200_000):
                body = f"m{i}".encode()
                client.publish("orders/eu/x", body, qos="guaranteed",
                               on_outcome=lambda o, b=body: done(o, b))
                published += 1
                if i % 50 == 49:
                    client.flush()
                    time.sleep(0.001)
                if i == 3_000:
                    wait_for(lambda: len(acked) > 1_000, 30, what="acknowledgements")
                    proc.kill()  # SIGKILL mid-stream
                    proc.wait(30)
        except ClientError:
            pass  # the appliance is gone
        finally:
            client.close()
        with lock:
            acknowledged = list(acked)
        assert len(acknowledged) > 1_000 and published > len(acknowledged)
        proc = run_appliance(config)  # reopens the logs (cuts a torn tail)
        stop(proc)
        kept = {payload for _, payload in _log_rows(cache_dir)}
        missing = [b for b in acknowledged if b not in kept]
        assert not missing, f"{len(missing)} acknowledged messages not in the log: {missing[:5]}"
    finally:
        stop(proc)


def _first_kept(client, cache_dir: Path) -> bool:
    client.publish("orders/eu/probe", b"probe", qos="guaranteed")
    client.flush(timeout=5)
    return (cache_dir / log_dir_name(PATTERN)).exists() and bool(_log_rows(cache_dir))
