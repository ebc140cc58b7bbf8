"""bench channel --kind rdma where no RDMA device is (the figures come from the soft-RoCE VM:
`make bench-rdma`): perftest's report read by column name, a clear error without a device."""

import argparse
import os
import types

import pytest

from bench import channel, channel_rdma
from channels.rdma import rdma_available
from datapath.errors import DeviceError

SEND_LAT = (
    " Dual-port       : OFF          Device         : rxe0\n"
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
    "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
    " 64      10000          30.12          812.40       41.07              44.88"
    "          20.31           98.55                  402.17  \n"
    "---------------------------------------------------------------------------------------\n")
SEND_BW = """\
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 64         100000           2.61               2.55                 0.039844
---------------------------------------------------------------------------------------
"""


def test_perftest_rows_are_read_by_column_name():
    lat = channel_rdma.perftest_table(SEND_LAT)
    assert lat["t_typical[usec]"] == 41.07
    assert lat["99% percentile[usec]"] == 98.55 and lat["99.9% percentile[usec]"] == 402.17
    assert lat["#iterations"] == 10000
    bw = channel_rdma.perftest_table(SEND_BW)
    assert bw["MsgRate[Mpps]"] == 0.039844 and bw["BW average[MB/sec]"] == 2.55


def test_a_perftest_report_without_a_result_row_is_an_error():
    with pytest.raises(DeviceError, match="perftest printed no result row"):
        channel_rdma.perftest_table(SEND_BW.splitlines()[1] + "\n Couldn't connect\n")


@pytest.mark.skipif(rdma_available()[0], reason="this machine has RDMA")
def test_without_rdma_the_benchmark_says_where_it_runs():
    parser = argparse.ArgumentParser()
    channel.add_arguments(parser)
    args = parser.parse_args(["--kind", "rdma", "--repeats", "1"])
    assert args.rdma_pair == channel_rdma.RDMA_PAIR
    with pytest.raises(DeviceError, match="no RDMA device.*make bench-rdma"):
        channel.run(args)


def test_the_rdma_pair_option_takes_two_addresses():
    parser = argparse.ArgumentParser()
    channel.add_arguments(parser)
    assert parser.parse_args(["--rdma-pair", "10.0.0.1,10.0.0.2"]).rdma_pair == \
        ("10.0.0.1", "10.0.0.2")
    with pytest.raises(SystemExit):
        parser.parse_args(["--rdma-pair", "10.0.0.1"])


def _fake_perftest(tmp_path, monkeypatch, row):
    """A stand-in ib_send_lat on PATH: the client prints ``row``, the server just exits."""
    tool = tmp_path / "ib_send_lat"
    lines = SEND_LAT.splitlines()
    tool.write_text("#!/bin/sh\n"
                    "for last; do :; done\n"  # the last argument: the server's address
                    'case "$last" in *.*.*.*) ;; *) exit 0 ;; esac\n'
                    f"printf '%s\\n' '{lines[1]}' '{row}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(channel_rdma, "SERVER_START_S", 0.1)
    end = types.SimpleNamespace(device="rxe0", gid_index=1)
    return (end, end)


def test_perftest_figures_are_taken_when_they_are_numbers(tmp_path, monkeypatch):
    ends = _fake_perftest(tmp_path, monkeypatch, SEND_LAT.splitlines()[2])
    row = channel_rdma.run_perftest("ib_send_lat", ends, 64, 10, "192.168.200.1",
                                    ("t_typical[usec]",))
    assert row["t_typical[usec]"] == 41.07


def test_perftest_runs_whose_clock_calibration_failed_are_retried_then_refused(
        tmp_path, monkeypatch):
    broken = " 64 10000 inf inf inf inf inf inf inf"
    ends = _fake_perftest(tmp_path, monkeypatch, broken)
    with pytest.raises(DeviceError, match=r"(?s)failed 3 times.*t_typical.*not a positive number"):
        channel_rdma.run_perftest("ib_send_lat", ends, 64, 10, "192.168.200.1",
                                  ("t_typical[usec]",))
