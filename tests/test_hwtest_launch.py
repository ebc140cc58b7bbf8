"""The hardware-test launcher's verdicts (hwtests/guest/launch.py), without booting the guest:
when the soft-RoCE guest cannot boot, ``make hwtest`` skips outside CI and fails under
``CI=true``; a report with nothing run, everything skipped, RDMA tests skipped or unreadable
fails everywhere."""

from pathlib import Path

import pytest

from hwtests.guest import launch


@pytest.mark.parametrize(("value", "ci"), [("true", True), ("TRUE", True), ("1", True),
                                           ("yes", True), ("false", False), ("", False),
                                           ("0", False), (None, False)])
def test_ci_is_what_ci_services_set(value, ci):
    assert launch.in_ci({} if value is None else {"CI": value}) is ci


def test_a_guest_that_cannot_boot_fails_under_ci_naming_why():
    status, message = launch.no_guest_verdict("qemu-system-x86_64 is not installed", ci=True)
    assert status == 1
    assert message.startswith("FAILED: ") and "qemu-system-x86_64 is not installed" in message
    assert "CI=true" in message and "must run, not skip" in message


def test_a_guest_that_cannot_boot_is_a_skip_that_says_so_outside_ci():
    status, message = launch.no_guest_verdict("qemu-system-x86_64 does not start", ci=False)
    assert status == 0
    assert "SKIPPED" in message and "qemu-system-x86_64 does not start" in message


@pytest.mark.parametrize(("ci", "status"), [("true", 1), ("false", 0)])
def test_make_hwtest_without_qemu_fails_under_ci_and_boots_nothing(monkeypatch, capsys, ci,
                                                                   status):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(launch, "host_has_rdma", lambda: (False, "no RDMA device"))
    monkeypatch.setattr(launch, "qemu_usable", lambda: (False, "qemu-system-x86_64 is not "
                                                        "installed"))

    def no_boot(*args, **kwargs):
        raise AssertionError("the guest must not be booted")
    monkeypatch.setattr(launch, "boot", no_boot)
    assert launch.main(["test"]) == status
    out = capsys.readouterr().out
    assert "qemu-system-x86_64 is not installed" in out
    assert ("FAILED" in out) == (status == 1) and ("SKIPPED" in out) == (status == 0)


def _report(tmp_path: Path, cases: list[tuple[str, str, str | None]]) -> Path:
    """A JUnit report of (classname, name, outcome: None passed, 'skipped', 'failure')."""
    rows = []
    for classname, name, outcome in cases:
        inner = f"<{outcome} message='x is not y&#10;more'/>" if outcome else ""
        rows.append(f"<testcase classname='{classname}' name='{name}'>{inner}</testcase>")
    counts = {k: sum(o == k for _, _, o in cases) for k in ("skipped", "failure")}
    path = tmp_path / "report.xml"
    path.write_text(f"<testsuites><testsuite name='pytest' tests='{len(cases)}' errors='0' "
                    f"failures='{counts['failure']}' skipped='{counts['skipped']}'>"
                    f"{''.join(rows)}</testsuite></testsuites>")
    return path


RDMA = "hwtests.rdma.test_channel"
OTHER = "hwtests.p4.test_bmv2"


@pytest.mark.parametrize(("cases", "why"), [
    ([], "no test ran"),
    ([(RDMA, "a", "skipped"), (OTHER, "b", "skipped")], "no test ran"),
    ([(RDMA, "a", "skipped"), (OTHER, "b", None)], "RDMA tests must run, not skip"),
    ([(OTHER, "b", None)], "RDMA tests must run, not skip"),
    ([(RDMA, "a", None), (RDMA, "b", "failure")], "1 failed"),
])
def test_a_report_with_nothing_run_or_rdma_skipped_fails(tmp_path, cases, why):
    ok, summary = launch.check_report(_report(tmp_path, cases), require_rdma=True)
    assert not ok and why in summary


def test_a_failed_test_is_named_with_the_first_line_of_why(tmp_path):
    ok, summary = launch.check_report(_report(tmp_path, [(RDMA, "a", None),
                                                         (RDMA, "b", "failure")]),
                                      require_rdma=True)
    assert not ok
    assert summary.split("\n")[1:] == [f"  failure: {RDMA}.b: x is not y"]


def test_a_report_where_the_rdma_tests_ran_and_passed_passes(tmp_path):
    ok, summary = launch.check_report(_report(tmp_path, [(RDMA, "a", None),
                                                         (OTHER, "b", "skipped")]),
                                      require_rdma=True)
    assert ok and summary == "2 tests: 1 passed, 0 failed, 0 errors, 1 skipped"


def test_a_missing_or_unreadable_report_fails(tmp_path):
    ok, summary = launch.check_report(tmp_path / "none.xml", require_rdma=True)
    assert not ok and "pytest did not run" in summary
    cut = tmp_path / "cut.xml"
    cut.write_text("<testsuites><testsuite tests='3'")
    ok, summary = launch.check_report(cut, require_rdma=True)
    assert not ok and "cannot be read" in summary
