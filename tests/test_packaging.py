"""``pip install`` of the wheel gives a complete CLI: the wheel is built from this tree,
installed into a new virtual environment (``python -m venv``, ``pip install --no-deps``) and
its ``topicwire`` runs an appliance, ``pub`` and ``sub`` through it, dissects a capture, writes
P4 entries with the P4Info it ships and runs ``bench fabric`` with the C relay it ships; the
commands of an extra say which to install.

The core dependencies are not unpacked again (half a gigabyte: numba's llvmlite, pyarrow):
the venv sees exactly the distributions the wheel's ``Requires-Dist`` names without an
extra, and what they require in turn, linked from the environment running the tests (a
``.pth`` naming a directory of links). A dependency the wheel forgot to declare, or one an
extra holds, is not there, as after ``pip install``. ``TOPICWIRE_WHEEL_TEST_PIP=1`` installs
them with pip instead (from its cache or the index).

Each run makes a new venv, and numba's compile cache for it is copied from the one
``topicwire warm`` filled for this tree (``make setup``): numba keys a cache entry by the
directory of its source file (a folder named after it), the source's mtime and size, the
function's bytecode and the CPU, so the files are copied to the folders of the installed
sources and those get the tree's mtimes. Without it every kernel compiles again in the wheel's
venv (minutes); a kernel the warm-up did not compile still compiles there, as for a user.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from appliance.ops.cli.extras import EXTRAS
from tests.appliance.helpers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VENV = ROOT / ".venv" / "wheel-test"
PACKAGES = ("appliance", "bench", "channels", "datapath", "nic_offload")
STEP_TIMEOUT_S = 240


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_dev_extra_holds_every_extra_and_the_core_no_extra():
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    core = {_name(r) for r in project["dependencies"]}
    dev = {_name(r) for r in extras["dev"]}
    for extra, modules in EXTRAS.items():
        names = {_name(r) for r in extras[extra]}
        assert names == set(modules), extra  # what extras.py checks is what the extra installs
        assert names <= dev and not names & core, extra
    assert all(re.search(r">=\d", r) for r in project["dependencies"]), "pin minimum versions"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin directory, environment) of the wheel installed into a new venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        ".ruff_cache", ".hypothesis", "tests", "hwtests"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "NUMBA_BOUNDSCHECK", "NUMBA_CACHE_DIR", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(tmp / "dist"), str(source)], env, cwd=tmp)
    wheel = next((tmp / "dist").glob("topicwire-*.whl"))
    shutil.rmtree(VENV, ignore_errors=True)
    with_pip = os.environ.get("TOPICWIRE_WHEEL_TEST_PIP") == "1"
    _run([sys.executable, "-m", "venv", *(() if with_pip else ("--without-pip",)), str(VENV)],
         env, cwd=tmp)
    python = str(VENV / "bin" / "python")
    pip = [python, "-m", "pip"] if with_pip else [sys.executable, "-m", "pip", "--python",
                                                  python]
    _run([*pip, "install", "-q", "--disable-pip-version-check",
          *(() if with_pip else ("--no-deps",)), str(wheel)], env, cwd=tmp)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     env, cwd=tmp).strip())
    if not with_pip:
        _link_core_dependencies(wheel, site, tmp / "core-deps")
    numba_cache = tmp / "numba"
    _seed_numba_cache(site, numba_cache, env)
    env.update(NUMBA_CACHE_DIR=str(numba_cache), XDG_CACHE_HOME=str(tmp / "cache"),
               PYTHONUNBUFFERED="1")
    yield VENV / "bin", env, tmp
    shutil.rmtree(VENV, ignore_errors=True)


def _numba_folder(directory: Path) -> str:
    """The folder numba's cache keeps the kernels of the sources in ``directory`` in (with
    ``NUMBA_CACHE_DIR`` set: numba.core.caching's user-provided locator)."""
    import hashlib

    path = os.path.abspath(directory)
    return f"{os.path.basename(path)}_{hashlib.sha1(path.encode()).hexdigest()}"


def _seed_numba_cache(site: Path, cache_root: Path, env: dict) -> None:
    """Copy the tree's warmed kernels into ``cache_root`` for the sources installed under
    ``site``, and give those sources the tree's mtimes (module docstring)."""
    tree_cache = Path(_run([sys.executable, "-c", "from datapath import jit; "
                            "print(jit.cache_dir())"], env, cwd=ROOT).strip())
    folders = {}
    for package in PACKAGES:
        for directory in [ROOT / package, *(p for p in (ROOT / package).rglob("*")
                                            if p.is_dir() and p.name != "__pycache__")]:
            folders[_numba_folder(directory)] = directory
    copied = 0
    if tree_cache.is_dir():
        for folder in tree_cache.iterdir():
            source_dir = folders.get(folder.name)
            if source_dir is None:
                continue
            installed = site / source_dir.relative_to(ROOT)
            target = cache_root / tree_cache.name / _numba_folder(installed)
            target.mkdir(parents=True, exist_ok=True)
            for entry in folder.iterdir():
                shutil.copy2(entry, target / entry.name)
                copied += 1
    for package in PACKAGES:
        for path in (site / package).rglob("*.py"):
            tree_file = ROOT / path.relative_to(site)
            if tree_file.exists():
                mtime = tree_file.stat().st_mtime
                os.utime(path, (mtime, mtime))
    print(f"numba cache: {copied} files from {tree_cache} (0: the tree is not warm; the "
          "wheel's commands compile their kernels)")


def _link_core_dependencies(wheel, site, links):
    """Make the wheel's core dependencies (and theirs) importable in the venv at ``site``:
    links to their files in this environment, in ``links``, named by a ``.pth``."""
    import zipfile
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [line.split(":", 1)[1].strip() for line in
                    zf.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")]
    todo, seen = list(requires), {}
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's, or not for this platform
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        dist = seen[name] = metadata.distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), (req, dist.version)
        todo += dist.requires or []
    links.mkdir()
    for dist in seen.values():
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or ()}:
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and \
                    not (links / top).exists():
                (links / top).symlink_to(base / top)
    (site / "topicwire-core-deps.pth").write_text(f"{links}\n")
    assert not {"pyspark", "pandas", "matplotlib"} & set(seen)


def _run(argv, env, cwd, check=True, timeout_s=STEP_TIMEOUT_S):
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} exited {done.returncode}: {done.stderr[-3000:]}")
    return done.stdout


def test_the_installed_package_has_its_data_and_no_extra(installed):
    bin_dir, env, tmp = installed
    out = _run([str(bin_dir / "topicwire"), "--version"], env, cwd=tmp)
    assert re.fullmatch(r"topicwire \S+ \(commit \S+, Python \S+, numba \S+\)\n", out)
    where = json.loads(_run([str(bin_dir / "python"), "-c", (
        "import json, importlib.util as u, appliance.ops.cli.p4_cmd as p4, bench.fabric as f; "
        "import appliance.ops.wireshark as w; "
        "print(json.dumps({'p4info': str(p4.DEFAULT_P4INFO), 'relay': str(f.RELAY_SOURCE), "
        "'dissector': str(w.SHIPPED_DISSECTOR), "
        "'missing': [m for m in ('pyspark', 'pandas', 'matplotlib') if not u.find_spec(m)]}))")],
        env, cwd=tmp))
    site = str(VENV)
    assert where["p4info"].startswith(site) and Path(where["p4info"]).is_file()
    assert where["relay"].startswith(site) and Path(where["relay"]).is_file()
    assert where["missing"] == ["pyspark", "pandas", "matplotlib"]
    # the Wireshark dissector ships, and the installed command generates the same
    assert where["dissector"].startswith(site) and Path(where["dissector"]).is_file()
    out = _run([str(bin_dir / "topicwire"), "dissector"], env, cwd=tmp)
    assert out == Path(where["dissector"]).read_text()
    # P4 entries from the P4Info the package holds
    out = _run([str(bin_dir / "topicwire"), "p4", "entries", "--snapshot",
                str(ROOT / "tests" / "p4" / "golden" / "snapshot.json"), "--out",
                str(tmp / "p4")], env, cwd=tmp)
    assert (tmp / "p4" / "runtime.json").is_file() and "p4c-bm2-ss" in out


@pytest.mark.parametrize(("argv", "extra"), [
    (["routes", "compute", "--telemetry", "t", "--out", "r.json"], "routes"),
    (["routes", "report", "--telemetry", "t", "--out", "r.png"], "routes"),
    (["bench", "routes"], "bench"),
])
def test_a_command_of_a_missing_extra_says_which_to_install(installed, argv, extra):
    bin_dir, env, tmp = installed
    done = subprocess.run([str(bin_dir / "topicwire"), *argv], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"pip install 'topicwire[{extra}]'" in done.stderr


def _wait_line(proc, stream, needle, timeout_s=STEP_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.5)
        if ready:
            line = stream.readline()
            seen.append(line)
            if needle in line:
                return line
        if proc.poll() is not None:
            break
    raise AssertionError(f"no {needle!r} (exit {proc.poll()}): {''.join(seen)[-3000:]}")


def test_run_pub_sub_pcap_and_bench_fabric_from_the_installed_cli(installed):
    bin_dir, env, tmp = installed
    topicwire = str(bin_dir / "topicwire")
    port, mgmt = free_port(), free_port()
    config = tmp / "pkg.toml"
    config.write_text(f'[appliance]\nname = "pkg"\n[clients]\nudp = "127.0.0.1:{port}"\n'
                      f'[pm]\nanonymous = true\n'
                      f'require_passwords = false\n[mgmt]\nlisten = "127.0.0.1:{mgmt}"\n')
    run = subprocess.Popen([topicwire, "run", "--config", str(config)], env=env, cwd=tmp,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sub = None
    try:
        _wait_line(run, run.stdout, " ready")
        address = f"127.0.0.1:{port}"
        sub = subprocess.Popen([topicwire, "sub", "--appliance", address, "pkg/#", "--count",
                                "5", "--stats"], env=env, cwd=tmp, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        _wait_line(sub, sub.stderr, "subscribed")
        _run([topicwire, "pub", "--appliance", address, "--topic", "pkg/a", "--count", "5"],
             env, cwd=tmp)
        out, err = sub.communicate(timeout=STEP_TIMEOUT_S)
        assert sub.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["received"] == 5
    finally:
        if sub is not None and sub.poll() is None:
            sub.kill()
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
    assert run.returncode == 0, run.stderr.read()
    # a small capture, dissected by the installed package
    capture = tmp / "small.pcap"
    _run([str(bin_dir / "python"), "-c", (
        "import sys; from scapy.all import Ether, IP, UDP, wrpcap; "
        "from datapath.protocol.codec import encode_data_frame; "
        "f = encode_data_frame([{'topic_key': 7, 'sequence': 1, 'payload': b'hi'}]); "
        "wrpcap(sys.argv[1], [Ether() / IP(dst='127.0.0.1') / UDP(dport=47470) / f])"),
        str(capture)], env, cwd=tmp)
    out = _run([topicwire, "pcap", str(capture)], env, cwd=tmp)
    assert " DATA " in out and out.splitlines()[-1].startswith("summary:")
    # bench fabric: the appliance hop beside the C relay the package ships
    out = _run([topicwire, "bench", "fabric", "--messages", "500", "--rate", "500",
                "--duration-s", "0.2", "--repeats", "1"], env, cwd=tmp)
    report = json.loads(out)
    assert report["bench"] == "fabric" and {"topicwire", "c_relay"} <= set(report["results"])


def test_the_systemd_unit_of_the_docs_verifies_against_the_installed_command(installed,
                                                                             tmp_path):
    """docs/examples/topicwire@.service, with /opt/topicwire pointing at the test venv, as
    systemd reads it: no unknown key, no value it cannot parse, a command that exists."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    text = (ROOT / "docs" / "examples" / "topicwire@.service").read_text()
    assert "ExecStart=/opt/topicwire/bin/topicwire run --config /etc/topicwire/%i.toml" in text
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text and "RestartPreventExitStatus=2" in text
    unit = tmp_path / "topicwire@core1.service"
    unit.write_text(text.replace("/opt/topicwire", str(VENV)))
    done = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
