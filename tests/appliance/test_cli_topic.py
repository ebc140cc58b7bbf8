"""``topicwire topic ...``: exit 0 true, 1 false, 2 invalid; --json prints the result."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.ops.cli import main


@pytest.mark.parametrize("args, code, text", [
    (["match", "a/+/c", "a/b/c"], 0, "true"),
    (["match", "#/c", "a/b"], 1, "false"),
    (["includes", "a/#", "a/+"], 0, "true"),
    (["includes", "a/#", "#/a"], 1, "false"),
    (["overlaps", "a/+", "+/a"], 0, "true (example: a/a)"),
    (["overlaps", "a/+", "b/#"], 1, "false"),
])
def test_predicates_exit_with_their_truth_value(args, code, text, capsys):
    assert main(["topic", *args]) == code
    assert capsys.readouterr().out.strip() == text


def test_json_output_is_a_result_object(capsys):
    assert main(["topic", "includes", "a/#", "a/+", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"result": True}
    assert main(["topic", "overlaps", "#/a", "a/#", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"result": True, "example": "a"}


@pytest.mark.parametrize("args", [
    ["match", "a/b#", "a/b"], ["match", "a/+", "a/+"], ["includes", "", "a"]])
def test_invalid_input_exits_2_with_a_message(args, capsys):
    assert main(["topic", *args]) == 2
    assert capsys.readouterr().err.startswith("topicwire: topics: invalid")


def test_the_installed_command_exits_with_the_documented_codes():
    exe = shutil.which("topicwire") or str(Path(sys.executable).parent / "topicwire")
    codes = [subprocess.run([exe, "topic", *a], capture_output=True).returncode for a in
             (["match", "a/#", "a"], ["match", "a/#", "b"], ["match", "a#", "a"])]
    assert codes == [0, 1, 2]
    wrong = subprocess.run([exe, "topic", "match", "only-one"], capture_output=True, text=True)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1  # one line, no usage block
    assert "required: TOPIC" in wrong.stderr and "--help" in wrong.stderr
