"""bench channel --kind rdma where no RDMA device is (the figures come from the soft-RoCE VM:
`make bench-rdma`): perftest's report read by column name, a clear error without a device."""

import argparse

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
