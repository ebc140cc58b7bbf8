"""Run ``topicwire`` with this issue's command modules registered (until the CLI lists them).

    python -m tests.appliance.twcli run --config FILE
"""

import importlib.util
import sys

import appliance.ops.cli as cli

EXTRA_COMMANDS = ("appliance.ops.cli.run_cmd", "appliance.ops.cli.pubsub_cmd")

cli.COMMAND_MODULES = tuple(cli.COMMAND_MODULES) + tuple(
    m for m in EXTRA_COMMANDS
    if m not in cli.COMMAND_MODULES and importlib.util.find_spec(m) is not None)

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
