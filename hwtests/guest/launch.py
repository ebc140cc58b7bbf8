"""Run the hardware tests (or the RDMA benchmark) where RDMA exists: here, or in a soft-RoCE VM.

    python -m hwtests.guest.launch test  [--junit PATH] [-- PYTEST_ARGS]   (make hwtest)
    python -m hwtests.guest.launch bench [--out PATH] [-- BENCH_ARGS]      (make bench-rdma)
    python -m hwtests.guest.launch run -- COMMAND...                       (any command)
    python -m hwtests.guest.launch images                  (only hwtests/images, on this host)

``test`` then runs ``hwtests/images`` here on the host (appliance disk images built and
booted under QEMU; nested in the soft-RoCE guest TCG would be far too slow); ``--no-images``
leaves them out.

If this machine has an RDMA device, ``test`` runs ``pytest hwtests/rdma hwtests/appliance``
here. Otherwise it boots
a guest with virtme-ng: a stock Debian kernel (``apt-get download`` of the package
linux-image-amd64 points to; it has rdma_rxe) over this machine's own root filesystem, so the
guest runs the project's venv as it is; QEMU in TCG (KVM aborts on this kind of machine), no
guest network at all. Inside, ``guest.sh`` runs ``provision.sh --devices`` (rxe0/rxe1 on the
two ends of a veth pair) and then the command. The guest writes only under ``--rwdir``
(``.venv/hwtest/rw``): the pytest JUnit report, benchmark JSON, numba's cache.

The run fails when the guest could not boot, ran no test, or skipped an RDMA test (CI must
not pass by skipping); when QEMU cannot run at all it says so and skips (exit 0), except
under CI (``CI=true``), where that is a failure too: a CI run never passes with nothing run.
The kernel, the virtme-ng venv and numba's compiled kernels are cached under ``.venv/hwtest``, so
only the first run downloads (~70 MB) and compiles.
"""

from __future__ import annotations

import argparse
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("TOPICWIRE_HWTEST_CACHE", ROOT / ".venv" / "hwtest"))
"""Kernel, virtme-ng venv and the guest's writable directory (env TOPICWIRE_HWTEST_CACHE)."""
VIRTME_NG_VERSION = "1.42"
"""virtme-ng from PyPI, pinned: its command line is what this module speaks."""
KERNEL_METAPACKAGE = "linux-image-amd64"
GUEST_MEMORY = "2G"
GUEST_CPUS = 2
GUEST_TIMEOUT_S = 1_800
"""The whole guest run (boot, tests, power-off) is stopped after this long."""
HEARTBEAT_S = 30
"""Without a terminal, a progress line at least this often."""
RDMA_TEST_PACKAGES = ("hwtests.rdma", "hwtests.appliance")
RDMA_TEST_DIRS = ("hwtests/rdma", "hwtests/appliance")
"""What `test` runs by default: the RDMA channel, and appliances that are neighbours over
RDMA (the other hwtests need no RDMA: `make unit` runs them)."""
DEFAULT_PYTEST_ARGS = ("-v", "-rP", "--durations=10")
"""Each test's verdict, the figures the passing ones print, the slowest ones: for the CI log."""
REQUIRE_RDMA_ENV = "TOPICWIRE_HWTEST_REQUIRE_RDMA"
"""Set in the guest: a missing RDMA device fails the RDMA tests instead of skipping them."""
QEMU = "qemu-system-x86_64"
CI_ENV = "CI"
"""``CI=true`` (as CI services set it): a run that cannot boot the guest fails, not skips."""


def say(message: str) -> None:
    print(f"hwtest: {message}", flush=True)


class LaunchError(Exception):
    """The harness could not do its job (exit 1 with this message)."""


# --- what this machine can do --------------------------------------------------------------

def host_has_rdma() -> tuple[bool, str]:
    from channels.rdma import rdma_available

    return rdma_available()


def qemu_usable() -> tuple[bool, str]:
    """Can QEMU run at all here? (False, why) when it is missing or does not start."""
    exe = shutil.which(QEMU)
    if exe is None:
        return False, f"{QEMU} is not installed (Debian package qemu-system-x86)"
    try:
        done = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{QEMU} does not start: {exc}"
    if done.returncode != 0:
        return False, f"{QEMU} does not start: {done.stderr.strip()[-300:]}"
    return True, done.stdout.splitlines()[0] if done.stdout else QEMU


# --- the kernel ---------------------------------------------------------------------------

def kernel_version() -> str:
    """The kernel ABI linux-image-amd64 depends on (6.1.0-56-amd64 and the like)."""
    done = subprocess.run(["apt-cache", "depends", KERNEL_METAPACKAGE], capture_output=True,
                          text=True)
    for line in done.stdout.splitlines():
        line = line.strip()
        if line.startswith("Depends: linux-image-"):
            return line.removeprefix("Depends: linux-image-")
    raise LaunchError(f"apt-cache knows no {KERNEL_METAPACKAGE}; run `apt-get update` "
                      f"({done.stderr.strip()[-300:]})")


def _package_size(package: str) -> int:
    done = subprocess.run(["apt-cache", "show", package], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("Size:"):
            return int(line.split()[1])
    return 0


def fetch_kernel() -> tuple[Path, str]:
    """(directory with boot/vmlinuz-V and lib/modules/V, V), downloading it the first time."""
    version = kernel_version()
    kdir = CACHE_DIR / "kernel" / version
    vmlinuz = kdir / "boot" / f"vmlinuz-{version}"
    if (kdir / ".complete").exists() and vmlinuz.exists():
        return kdir, version
    package = f"linux-image-{version}"
    download = CACHE_DIR / "download"
    shutil.rmtree(download, ignore_errors=True)
    download.mkdir(parents=True)
    total = _package_size(package)
    say(f"downloading {package} ({total / 1e6:.0f} MB) with apt-get download")
    proc = subprocess.Popen(["apt-get", "download", "-o", "APT::Sandbox::User=root", package],
                            cwd=download, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    _show_download(proc, download, total, package)
    output = proc.stdout.read()
    if proc.wait() != 0:
        raise LaunchError(f"apt-get download {package} failed: {output[-1000:]}")
    debs = list(download.glob("*.deb"))
    if not debs:
        raise LaunchError(f"apt-get download {package} left no .deb: {output[-1000:]}")
    shutil.rmtree(kdir, ignore_errors=True)
    kdir.mkdir(parents=True)
    say(f"unpacking {debs[0].name}")
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(kdir)], check=True)
    if not vmlinuz.exists():
        raise LaunchError(f"{debs[0].name} has no boot/vmlinuz-{version}")
    (kdir / ".complete").touch()
    shutil.rmtree(download, ignore_errors=True)
    return kdir, version


def _show_download(proc: subprocess.Popen, folder: Path, total: int, what: str) -> None:
    """A progress bar (terminal) or progress lines while ``proc`` fills ``folder``."""
    def done_bytes() -> int:
        return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())

    if sys.stdout.isatty():
        from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

        with Progress(*Progress.get_default_columns(), DownloadColumn(),
                      TransferSpeedColumn()) as progress:
            task = progress.add_task(what, total=total or None)
            while proc.poll() is None:
                progress.update(task, completed=done_bytes())
                time.sleep(0.2)
            progress.update(task, completed=done_bytes())
        return
    last = 0.0
    while proc.poll() is None:
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            got = done_bytes()
            share = f" ({100 * got / total:.0f} %)" if total else ""
            say(f"  {what}: {got / 1e6:.1f} MB{share}")
        time.sleep(0.2)
    say(f"  {what}: {done_bytes() / 1e6:.1f} MB, done")


# --- virtme-ng ----------------------------------------------------------------------------

def virtme_ng() -> Path:
    """The bin directory of a venv with virtme-ng (pinned), made the first time."""
    venv = CACHE_DIR / "vng"
    stamp = venv / f".virtme-ng-{VIRTME_NG_VERSION}"
    if stamp.exists() and (venv / "bin" / "vng").exists():
        return venv / "bin"
    shutil.rmtree(venv, ignore_errors=True)
    python = shutil.which("python3") or sys.executable
    say(f"making a venv with virtme-ng {VIRTME_NG_VERSION} ({venv})")
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q",
                           f"virtme-ng=={VIRTME_NG_VERSION}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise LaunchError(f"pip install virtme-ng=={VIRTME_NG_VERSION} failed: "
                          f"{done.stderr[-1500:]}")
    stamp.touch()
    return venv / "bin"


# --- the guest ----------------------------------------------------------------------------

def guest_env(rw: Path) -> dict[str, str]:
    """Environment of the command in the guest (and of the host-side numba warm-up)."""
    return {"NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(rw / "numba"),
            "PYTHONUNBUFFERED": "1", REQUIRE_RDMA_ENV: "1", "HOME": str(rw / "home")}


def warm_numba(rw: Path) -> None:
    started = time.monotonic()
    env = {**os.environ, **guest_env(rw)}
    done = subprocess.run([sys.executable, "-m", "hwtests.guest.warm"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise LaunchError(f"compiling the numba kernels for the guest failed: "
                          f"{done.stderr[-2000:]}")
    say(f"numba kernels for the guest ready ({time.monotonic() - started:.1f} s)")


class Progress:
    """Where the guest is, for the person (or CI log) waiting: phases from its output."""

    PHASES = (("topicwire-guest: up", "guest up, making soft-RoCE devices"),
              ("topicwire-guest: soft-RoCE ready", "soft-RoCE ready, running the command"),
              ("topicwire-guest: command exited", "command done, powering off"))

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.phase = "booting the kernel under QEMU (TCG)"
        self.tty = sys.stdout.isatty()
        self.last_print = self.start
        self.status = None
        if self.tty:
            from rich.console import Console

            self.console = Console()
            self.status = self.console.status(self._text())
            self.status.start()
        say(f"{self.phase}")

    def _text(self) -> str:
        return f"hwtest: {self.phase} ({time.monotonic() - self.start:.0f} s)"

    def line(self, text: str) -> None:
        for marker, phase in self.PHASES:
            if text.startswith(marker):
                self.phase = phase
        if self.tty:
            self.console.print(f"guest| {text}", markup=False, highlight=False)
        else:
            print(f"guest| {text}", flush=True)
        self.last_print = time.monotonic()
        self.tick()

    def tick(self) -> None:
        if self.status is not None:
            self.status.update(self._text())
        elif time.monotonic() - self.last_print >= HEARTBEAT_S:
            self.last_print = time.monotonic()
            print(self._text(), flush=True)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()


def boot(command: list[str], rw: Path, log: Path) -> int:
    """Boot the guest, run ``command`` in it (cwd: the project); return its exit status."""
    kdir, version = fetch_kernel()
    vng_bin = virtme_ng()
    warm_numba(rw)
    env_words = [f"{k}={v}" for k, v in guest_env(rw).items()]
    inner = ["env", *env_words, "sh", "hwtests/guest/guest.sh", *command]
    cmd = [str(vng_bin / "vng"), "--run", str(kdir / "boot" / f"vmlinuz-{version}"),
           "--disable-kvm", "--force-9p", "--memory", GUEST_MEMORY, "--cpus", str(GUEST_CPUS),
           "--rwdir", str(rw), "--exec", shlex.join(inner)]
    env = {**os.environ, "PATH": f"{vng_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    progress = Progress()
    lines: queue.Queue[str | None] = queue.Queue()
    # QEMU reopens its stdout/stderr: a pipe keeps every line, a plain file loses some
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            errors="replace")

    def pump() -> None:
        for text in proc.stdout:
            lines.put(text.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + GUEST_TIMEOUT_S
    seen_guest = False
    with log.open("w") as out:
        try:
            while True:
                try:
                    text = lines.get(timeout=1.0)
                except queue.Empty:
                    progress.tick()
                    if time.monotonic() > deadline:
                        proc.kill()
                        raise LaunchError(f"the guest ran longer than {GUEST_TIMEOUT_S} s; "
                                          f"stopped it (log: {log})") from None
                    continue
                if text is None:
                    break
                out.write(text + "\n")
                seen_guest |= text.startswith("topicwire-guest: up")
                progress.line(text)
        finally:
            progress.stop()
    status = proc.wait()
    elapsed = time.monotonic() - progress.start
    if not seen_guest:
        raise LaunchError(f"the guest did not boot (vng exited {status} after {elapsed:.0f} "
                          f"s; log: {log}); QEMU is installed, so this is a failure")
    say(f"guest finished in {elapsed:.0f} s (command exit status {status})")
    return status


# --- verdicts -----------------------------------------------------------------------------

def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this runs under CI: ``CI`` set to true (or 1, yes)."""
    return environ.get(CI_ENV, "").strip().lower() in ("true", "1", "yes")


def no_guest_verdict(why: str, *, ci: bool) -> tuple[int, str]:
    """(exit status, message) when there is no RDMA device here and QEMU cannot run
    (``why``), so the soft-RoCE guest cannot boot: outside CI a skip that says so (0);
    under CI a failure naming why (1), since a CI run must never pass with nothing run."""
    if ci:
        return 1, (f"FAILED: no RDMA device here and the soft-RoCE guest cannot boot: QEMU "
                   f"cannot run ({why}); under CI ({CI_ENV}=true) the RDMA hardware tests "
                   "must run, not skip: install qemu-system-x86 (make setup does) or run on "
                   "a machine with an RDMA device")
    return 0, (f"no RDMA device here and QEMU cannot run ({why}): the RDMA hardware tests "
               f"are SKIPPED on this machine (under CI, {CI_ENV}=true, this fails)")


def check_report(report: Path, *, require_rdma: bool) -> tuple[bool, str]:
    """(ok, summary) of a pytest JUnit report: tests ran, none failed, RDMA tests not skipped."""
    if not report.exists():
        return False, f"no test report ({report}): pytest did not run"
    try:
        root = ET.parse(report).getroot()
    except ET.ParseError as exc:
        return False, f"the test report {report} cannot be read ({exc}): pytest did not finish"
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    ran = counts["tests"] - counts["skipped"]
    summary = (f"{counts['tests']} tests: {ran - counts['failures'] - counts['errors']} passed, "
               f"{counts['failures']} failed, {counts['errors']} errors, "
               f"{counts['skipped']} skipped")
    if ran <= 0:
        return False, f"{summary}: no test ran"
    skipped_rdma = [f"{case.get('classname')}.{case.get('name')}"
                    for case in root.iter("testcase")
                    if case.find("skipped") is not None
                    and (case.get("classname") or "").startswith(RDMA_TEST_PACKAGES)]
    rdma_ran = [case for case in root.iter("testcase")
                if (case.get("classname") or "").startswith(RDMA_TEST_PACKAGES)
                and case.find("skipped") is None]
    if require_rdma and (skipped_rdma or not rdma_ran):
        return False, (f"{summary}: RDMA tests must run, not skip "
                       f"({', '.join(skipped_rdma[:5]) or 'none ran'})")
    failed = _failed_cases(root)
    return counts["failures"] + counts["errors"] == 0, "\n".join([summary, *failed])


def _failed_cases(root: ET.Element) -> list[str]:
    """A line per failed test (its name and the first line of why), so the end of a CI log
    says which test failed without the report."""
    lines = []
    for case in root.iter("testcase"):
        for verdict in ("failure", "error"):
            found = case.find(verdict)
            if found is not None:
                why = (found.get("message") or found.text or "").strip().splitlines() or [""]
                lines.append(f"  {verdict}: {case.get('classname')}.{case.get('name')}: "
                             f"{why[0][:400]}")
    return lines


# --- commands -----------------------------------------------------------------------------

def _rw_dir() -> Path:
    rw = CACHE_DIR / "rw"
    for sub in ("numba", "out", "home"):
        (rw / sub).mkdir(parents=True, exist_ok=True)
    return rw


def _no_qemu_skip() -> int | None:
    """None when QEMU can run; else the exit status (a skip, or under CI a failure)."""
    ok, why = qemu_usable()
    if not ok:
        status, message = no_guest_verdict(why, ci=in_ci())
        say(message)
        return status
    return None


def cmd_test(args: argparse.Namespace) -> int:
    started = time.monotonic()
    python = sys.executable
    here, devices = host_has_rdma()
    pytest_args = args.rest or [*RDMA_TEST_DIRS, *DEFAULT_PYTEST_ARGS]
    if here:
        say(f"this machine has RDMA ({devices}): running the hardware tests here")
        report = CACHE_DIR / "host-report.xml"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.unlink(missing_ok=True)
        subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider",
                        f"--junitxml={report}", *pytest_args], cwd=ROOT)
        ok, summary = check_report(report, require_rdma=True)
    else:
        skip = _no_qemu_skip()
        if skip is not None:
            return skip
        say("no RDMA device here: booting the soft-RoCE guest")
        rw = _rw_dir()
        report = rw / "out" / "report.xml"
        report.unlink(missing_ok=True)
        # hypothesis' plugin only costs import time there (no hwtest uses it)
        boot([python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
              f"--junitxml={report}", *pytest_args], rw, rw / "out" / "guest.log")
        ok, summary = check_report(report, require_rdma=True)
    if args.junit:
        Path(args.junit).parent.mkdir(parents=True, exist_ok=True)
        if report.exists():
            shutil.copyfile(report, args.junit)
    where = "here" if here else "in the soft-RoCE guest"
    head, *failed = summary.split("\n")
    say(f"{'PASSED' if ok else 'FAILED'} {where}: {head} "
        f"(report {report}; {time.monotonic() - started:.0f} s in all)")
    for line in failed:
        say(line)
    if not args.rest and not args.no_images:
        ok = run_image_tests(args) and ok
    return 0 if ok else 1


IMAGE_TESTS_ENV = "TOPICWIRE_IMAGE_TESTS"
"""Set by ``run_image_tests``: hwtests/images boots images only then (``make unit`` collects
the folder too, and skips it)."""


IMAGE_TEST_TIMEOUT_S = 3600
"""pytest-timeout for each image test (pyproject's 600 s is too short for the first one: its
fixture builds the image from nothing, 860-970 s measured at host load 10-14; each boot has
its own deadline)."""


def run_image_tests(args: argparse.Namespace) -> bool:
    """hwtests/images, here on the host (nested TCG in the soft-RoCE guest is far too slow):
    appliance images built and booted under QEMU. Skips only where QEMU cannot run (CI: fails)."""
    started = time.monotonic()
    skip = _no_qemu_skip()
    if skip is not None:
        return skip == 0
    say("appliance images: building (cached by digest) and booting them under QEMU here")
    report = CACHE_DIR / "images-report.xml"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                    f"--junitxml={report}", f"--timeout={IMAGE_TEST_TIMEOUT_S}",
                    "hwtests/images", *DEFAULT_PYTEST_ARGS], cwd=ROOT,
                   env={**os.environ, IMAGE_TESTS_ENV: "1"})
    ok, summary = check_report(report, require_rdma=False)
    if ok and in_ci() and "0 skipped" not in summary:
        ok, summary = False, f"{summary}: under CI the image tests must run, not skip"
    head, *failed = summary.split("\n")
    say(f"{'PASSED' if ok else 'FAILED'} appliance images: {head} (report {report}; "
        f"{time.monotonic() - started:.0f} s)")
    for line in failed:
        say(line)
    if args.junit and report.exists():
        shutil.copyfile(report, Path(args.junit).with_suffix(".images.xml"))
    return ok


def cmd_bench(args: argparse.Namespace) -> int:
    python = sys.executable
    bench = [python, "-m", "bench.rdma_guest", *(args.rest or [])]
    here, devices = host_has_rdma()
    if here:
        say(f"this machine has RDMA ({devices}): benchmarking here")
        out = Path(args.out or CACHE_DIR / "bench-rdma.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        status = subprocess.run([*bench, "--out", str(out)], cwd=ROOT).returncode
    else:
        skip = _no_qemu_skip()
        if skip is not None:
            return skip
        rw = _rw_dir()
        result = rw / "out" / "bench-rdma.json"
        result.unlink(missing_ok=True)
        status = boot([*bench, "--out", str(result)], rw, rw / "out" / "bench-guest.log")
        out = Path(args.out) if args.out else result
        if args.out and result.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(result, out)
    if status != 0 or not out.exists():
        say(f"the benchmark failed (exit status {status}); see the log above")
        return 1
    print(out.read_text(), end="")
    say(f"report written to {out}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if not args.rest:
        raise LaunchError("run needs a command after --")
    skip = _no_qemu_skip()
    if skip is not None:
        return 1
    rw = _rw_dir()
    return boot(args.rest, rw, rw / "out" / "run.log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hwtests.guest.launch",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    test = sub.add_parser("test", help="run the hardware tests (default: pytest hwtests)")
    test.add_argument("--junit", help="also copy the JUnit report here")
    test.add_argument("--no-images", action="store_true",
                      help="only the RDMA tests, not the appliance images (hwtests/images)")
    images = sub.add_parser("images", help="only the appliance image tests (hwtests/images)")
    images.add_argument("--junit", help="also copy the JUnit report here (.images.xml)")
    bench = sub.add_parser("bench", help="run the RDMA benchmark with perftest beside it")
    bench.add_argument("--out", help="also write the JSON report here")
    sub.add_parser("run", help="run any command in the guest")
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    args = parser.parse_args(argv)
    args.rest = rest
    try:
        if args.command == "images":
            return 0 if run_image_tests(args) else 1
        return {"test": cmd_test, "bench": cmd_bench, "run": cmd_run}[args.command](args)
    except LaunchError as exc:
        say(f"FAILED: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
