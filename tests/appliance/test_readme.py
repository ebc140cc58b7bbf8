"""The README's Python snippet runs exactly as printed and prints what it says it prints.

An appliance listens on the snippet's address (127.0.0.1:47471) inside a network namespace
this test makes, so the fixed port is always free; the snippet runs in the same namespace.
"""

from __future__ import annotations

import re
import sys
import uuid

from appliance.control.credentials import hash_password
from tests.appliance.helpers import FABRIC_KEY, ROOT, wait_ready
from tests.netns import Host, requires_netns


def _snippet() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "the README has one Python snippet"
    return blocks[0]


@requires_netns
def test_the_readme_snippet_prints_the_message_it_published(tmp_path) -> None:
    snippet = _snippet()
    promised = re.search(r"# prints: (.*)$", snippet, re.M)
    assert promised, "the snippet says what it prints"
    password = re.search(r'password="([^"]+)"', snippet)
    assert password, "the snippet logs in with a password (P&M requires one by default)"
    config = tmp_path / "a.toml"
    config.write_text("\n".join([
        "[appliance]", 'name = "readme"', "[fabric]", 'listen = "127.0.0.1:47470"',
        f'key = "{FABRIC_KEY}"', "[clients]", 'udp = "127.0.0.1:47471"', "[pm]",
        'mode = "embedded"', "[pm.identities.trader1]", 'publish = ["prices/#"]',
        'subscribe = ["prices/#"]', f'password = "{hash_password(password.group(1))}"']) + "\n")
    host = Host(f"twreadme{uuid.uuid4().hex[:8]}")
    proc = None
    try:
        proc = host.popen([sys.executable, "-m", "tests.appliance.twcli", "run", "--config",
                           str(config)], cwd=ROOT, stdout=-1, stderr=-1, text=True)
        wait_ready(proc)
        done = host.run(sys.executable, "-c", snippet, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == promised.group(1).strip()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
        host.close()
