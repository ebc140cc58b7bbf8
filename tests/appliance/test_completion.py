"""``topicwire completion bash``: the generated script completes commands, sub-commands and
options, run by a real bash; ``TOPICWIRE_APPLIANCE`` is the default of ``--appliance``."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.appliance.helpers import ROOT

CLI = [sys.executable, "-c", "import sys; from appliance.ops.cli import main; "
       "sys.exit(main(sys.argv[1:]))"]


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> str:
    done = subprocess.run([*CLI, "completion", "bash"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    path = tmp_path_factory.mktemp("completion") / "topicwire.bash"
    path.write_text(done.stdout)
    return str(path)


def _complete(script: str, *words: str) -> list[str]:
    line = " ".join(f"'{w}'" for w in ("topicwire", *words))
    code = (f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; _topicwire; "
            'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_commands_subcommands_and_options(script) -> None:
    assert _complete(script, "ru") == ["run"]
    assert {"run", "routes"} <= set(_complete(script, "r"))
    assert "status" in _complete(script, "")
    assert _complete(script, "bench", "fab") == ["fabric"]
    assert _complete(script, "bench", "fabric", "--control") == ["--control-load"]
    assert _complete(script, "pub", "--to") == ["--topic"]
    assert set(_complete(script, "routes", "")) >= {"compute", "report"}


def test_pub_takes_its_appliance_from_the_environment() -> None:
    env = {"TOPICWIRE_APPLIANCE": "ftp://nowhere", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*CLI, "pub", "--topic", "a/b"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert "ftp://nowhere" in done.stderr  # the environment's address was the one tried
    done = subprocess.run([*CLI, "pub", "--topic", "a/b"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert "TOPICWIRE_APPLIANCE" in done.stderr
