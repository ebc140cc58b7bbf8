"""The corpus: inputs that once crashed a decoder or an appliance, kept as regression tests.

One JSON file per input in tests/fuzz/corpus/, named ``<target>-<hash>.json`` (the first 16
hex digits of the SHA-256 of its canonical JSON: the same input is saved once). Bytes are
hex. ``target`` says what replays it (tests/fuzz/test_corpus.py):

- ``decode_frame``, ``batch``, ``softnic``: ``{"hex"}``, a datagram;
- ``document``: ``{"kind", "sender", "hex"}``, a CONTROL document (UTF-8);
- ``config``: ``{"hex"}``, a TOML file; ``registry``: a registry file; ``pcap``: a capture;
- ``live``: ``{"port", "frames": [{"source", "hex", "signed", "session"}]}``, frames sent to a
  live appliance in order from the fuzzer's sockets (``source``: ``anon``, ``session``,
  ``neighbour``, ``stranger``; ``signed``: signed again by the neighbour when sent;
  ``session``: the session its ``source_session`` claimed, replaced by the replay's).

``note`` says what the input did when it was found.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"


def name_of(entry: dict[str, Any]) -> str:
    body = {k: v for k, v in entry.items() if k != "note"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return f"{entry['target']}-{digest}.json"


def save(entry: dict[str, Any], directory: Path = CORPUS_DIR) -> Path:
    """Write ``entry`` (once: the name is its hash); returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name_of(entry)
    if not path.exists():
        path.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    return path


def entries(directory: Path = CORPUS_DIR) -> list[tuple[Path, dict[str, Any]]]:
    """Every corpus file and what it holds, by name."""
    return [(p, json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]
