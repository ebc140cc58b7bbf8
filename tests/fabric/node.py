"""One fabric node for the namespace tests: an appliance plus its local clients, driven by
JSON lines on standard input (one answer line each on standard output).

    python -m tests.fabric.node CONFIG.toml

Commands: ``connect`` {client, identity}, ``subscribe``/``unsubscribe`` {client, pattern,
qos, selector}, ``publish`` {client, topics, rounds, qos, numbered, payload} (``numbered``: payloads
count 0, 1, ... per client; else ``payload``, else the topic), ``stream`` {client, topics,
interval_s} (publish in the background until ``end_stream``; ``streamed`` {client}: rounds
published so far), ``received`` {client} (what arrived since the last call: per-topic
counts and duplicates), ``publish_events`` {client, events: [[topic, payload hex]], schema_id},
``log`` {client} (arrivals since the last call, in order: [pattern,
topic, payload, origin, stream, payload hex], and loss events), ``status``,
``submit`` {command, args},
``quit``. The
appliance runs in this process (the same ``Appliance`` that ``topicwire run`` runs), so the
test can read its status; neighbours are other processes in other namespaces.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter

from appliance.client import ClientError, connect
from appliance.config import load_config
from appliance.node import Appliance


class Node:
    def __init__(self, config_path: str) -> None:
        self.config = load_config(config_path)
        self.app = Appliance(self.config).start()
        host, port = self.config.clients_udp
        self.url = f"udp://{host}:{port}"
        self.clients = {}
        self.inbox: dict[str, list] = {}
        self.seen: dict[str, set] = {}
        self.duplicates: Counter = Counter()
        self.log: dict[str, list] = {}
        self.losses: dict[str, list] = {}
        self.numbered: Counter = Counter()
        self.streams: dict[str, tuple[threading.Event, threading.Thread, Counter]] = {}
        self.streamed: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def _record(self, name, pattern):
        """Count each message once per client (a client whose subscriptions overlap gets one
        copy per matching subscription); the same message twice on one subscription is a
        duplicate."""
        def on_message(msg):
            ident = (msg.origin, msg.stream, msg.topic_key, msg.sequence)
            with self.lock:
                if (pattern, ident) in self.seen[name]:
                    self.duplicates[name] += 1
                    return
                self.seen[name].add((pattern, ident))
                self.log[name].append([pattern, msg.topic, msg.payload.decode(errors="replace"),
                                       msg.origin, msg.stream, msg.payload.hex()])
                if ident not in self.seen[name]:
                    self.seen[name].add(ident)
                    self.inbox[name].append(msg.topic)
        return on_message

    def handle(self, cmd: dict) -> dict:
        op = cmd["cmd"]
        if op == "connect":
            name = cmd["client"]
            self.clients[name] = connect(self.url, cmd.get("identity", "feed"))
            self.inbox[name], self.seen[name] = [], set()
            self.log[name], self.losses[name] = [], []
            return {"ok": True, "session": self.clients[name].session}
        client = self.clients.get(cmd.get("client"))
        if op == "subscribe":
            name = cmd["client"]

            def on_loss(loss, name=name, pattern=cmd["pattern"]):
                with self.lock:
                    self.losses[name].append([pattern, loss.messages, loss.reason, loss.at])
            try:
                client.subscribe(cmd["pattern"], qos=cmd.get("qos", "best-effort"),
                                 selector=cmd.get("selector"),
                                 callback=self._record(name, cmd["pattern"]), on_loss=on_loss)
            except ClientError as exc:
                return {"ok": False, "error": str(exc)}
            return {"ok": True}
        if op == "unsubscribe":
            client.unsubscribe(cmd["pattern"])
            return {"ok": True}
        if op == "publish":
            sent = Counter()
            try:
                qos = cmd.get("qos", "best-effort")
                for _ in range(cmd.get("rounds", 1)):
                    for topic in cmd["topics"]:
                        if cmd.get("numbered"):
                            payload = str(self.numbered[cmd["client"]]).encode()
                            self.numbered[cmd["client"]] += 1
                        elif cmd.get("payload") is not None:
                            payload = cmd["payload"].encode()
                        else:
                            payload = topic.encode()
                        client.publish(topic, payload, qos=qos)
                        sent[topic] += 1
                client.flush()
            except ClientError as exc:
                return {"ok": False, "error": str(exc), "sent": sent}
            return {"ok": True, "sent": sent}
        if op == "publish_events":  # [[topic, payload hex], ...] with schema_id
            for topic, payload in cmd["events"]:
                client.publish(topic, bytes.fromhex(payload), schema_id=cmd["schema_id"])
            client.flush()
            return {"ok": True, "sent": len(cmd["events"])}
        if op == "stream":
            stop, counts, rounds = threading.Event(), Counter(), [0]

            def run():
                while not stop.is_set():
                    for topic in cmd["topics"]:
                        client.publish(topic, topic.encode())
                        counts[topic] += 1
                    client.flush()
                    rounds[0] += 1
                    time.sleep(cmd.get("interval_s", 0.01))
            thread = threading.Thread(target=run, daemon=True)
            self.streams[cmd["client"]] = (stop, thread, counts)
            self.streamed[cmd["client"]] = rounds
            thread.start()
            return {"ok": True}
        if op == "streamed":
            return {"ok": True, "rounds": self.streamed[cmd["client"]][0]}
        if op == "end_stream":
            stop, thread, counts = self.streams.pop(cmd["client"])
            stop.set()
            thread.join()
            return {"ok": True, "sent": counts}
        if op == "received":
            name = cmd["client"]
            with self.lock:
                got, self.inbox[name] = self.inbox[name], []
                dups = self.duplicates.pop(name, 0)
            return {"ok": True, "counts": Counter(got), "duplicates": dups}
        if op == "log":
            name = cmd["client"]
            with self.lock:
                got, self.log[name] = self.log[name], []
                losses, self.losses[name] = self.losses[name], []
            return {"ok": True, "log": got, "losses": losses,
                    "guaranteed": self.clients[name].guaranteed_counters()}
        if op == "status":
            return {"ok": True, "status": self.app.status()}
        if op == "submit":
            return {"ok": True, "result": self.app.submit(cmd["command"], cmd.get("args", {}))}
        if op == "quit":
            for c in self.clients.values():
                c.close()
            self.app.stop()
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {op!r}"}


def main() -> int:
    node = Node(sys.argv[1])
    print(json.dumps({"ok": True, "ready": node.config.name}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            answer = node.handle(cmd)
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
        if cmd["cmd"] == "quit":
            return 0
    node.app.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
