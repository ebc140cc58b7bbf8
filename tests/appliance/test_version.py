"""``topicwire --version`` and the build in ``/status``: which code a running appliance is."""

from __future__ import annotations

import re
import subprocess
import sys

from appliance.build_info import build_info
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import ROOT, free_port, wait_for


def test_version_names_the_version_commit_python_and_numba() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; from appliance.ops.cli import "
                           "main; sys.exit(main(sys.argv[1:]))", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"topicwire \S+ \(commit [0-9a-f]{12}, Python 3\.\d+\.\d+, numba "
                        r"\S+\)\n", done.stdout), done.stdout


def test_the_status_names_the_build() -> None:
    app = Appliance(parse_config({"appliance": {"name": f"ver{free_port()}"},
                                  "fabric": {"listen": f"127.0.0.1:{free_port()}",
                                             "key": "66" * 32}})).start()
    try:
        build = wait_for(lambda: app.status().get("node", {}).get("build"))
        assert build == build_info()
        assert set(build) == {"version", "commit", "python", "numba"}
    finally:
        app.stop()
