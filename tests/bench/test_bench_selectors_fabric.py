"""bench.selectors_fabric at tiny sizes: both designs measured in one run, the report's shape,
and the appliance design sending clients fewer messages and bytes."""

import argparse
import json
import random

from bench import selectors_fabric
from nic_offload.selectors import compile_selector

TINY = ["--subscribers", "40", "--clients", "2", "--messages", "60", "--symbols", "20",
        "--repeats", "1", "--seed", "3"]


def test_both_designs_in_one_run():
    parser = argparse.ArgumentParser()
    selectors_fabric.add_arguments(parser)
    report = json.loads(json.dumps(selectors_fabric.run(parser.parse_args(TINY))))
    assert report["bench"] == "selectors-fabric"
    params, results = report["params"], report["results"]
    assert params["subscribers"] == 40 and params["clients"] == 2
    assert set(results) == {"topicwire", "in_clients"}
    for figures in results.values():
        assert figures["msgs_per_s"] > 0 and figures["lost"] == 0
    assert (params["client_messages_appliance_design"]
            < params["client_messages_client_design"] == 120)
    assert results["topicwire"]["bytes_to_clients"] < results["in_clients"]["bytes_to_clients"]
    assert params["selector_filtered_total"] > 0
    assert "msgs_per_s topicwire/in_clients" in report["ratios"]


def test_each_client_asks_about_its_own_symbols():
    parser = argparse.ArgumentParser()
    selectors_fabric.add_arguments(parser)
    args = parser.parse_args(["--subscribers", "30", "--symbols", "9"])
    plan = selectors_fabric.selector_plan(args, 3, random.Random(1))
    assert [len(texts) for texts in plan] == [10, 10, 10]
    for i, texts in enumerate(plan):
        for text in texts:
            compile_selector(text)
            symbols = {int(part[1:]) for part in text.split("'")[1::2] if part != "B"}
            assert all(s % 3 == i for s in symbols), text
