"""Write snapshot.json (tests/p4/snapshot.py through nic_offload.runtime_json) and the files
``topicwire p4 entries`` makes of it. Run when the snapshot or the P4 program changes, and
review the diff: the stored files are the contract the CLI is tested against.

    .venv/bin/python -m tests.p4.golden.regenerate
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from appliance.ops.cli import p4_cmd
from nic_offload import runtime_json
from tests.p4.snapshot import entry_set

HERE = Path(__file__).parent


def main() -> None:
    runtime_json.save(entry_set(), HERE / "snapshot.json")
    with tempfile.TemporaryDirectory() as tmp:
        p4_cmd.write_entries(HERE / "snapshot.json", Path(tmp), bmv2_json=None)
        for name in (p4_cmd.RUNTIME_FILE, p4_cmd.COMMANDS_FILE):
            shutil.copyfile(Path(tmp) / name, HERE / name)


if __name__ == "__main__":
    main()
