"""``topicwire subs replay``: the resulting list and per-topic decisions."""

import io
import json

from appliance.ops.cli import main


def test_replay_prints_the_list_and_decisions(tmp_path, capsys):
    requests = tmp_path / "requests.txt"
    requests.write_text("+a/#\n-a/b/#\n\n+a/c\n+a/+/c\n")
    assert main(["subs", "replay", str(requests), "--publish", "a/b/c", "--publish",
                 "a/b/d"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["list: +a/# -a/b/# +a/+/c", "a/b/c: deliver", "a/b/d: do not deliver"]


def test_replay_json_has_the_documented_shape(tmp_path, capsys):
    requests = tmp_path / "r.txt"
    requests.write_text("+a/#\n-a/b/#\n")
    assert main(["subs", "replay", str(requests), "--publish", "a/b/c", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "list": ["+a/#", "-a/b/#"], "decisions": {"a/b/c": False}}


def test_replay_reads_standard_input(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("+#\n-x/#\n"))
    assert main(["subs", "replay", "-", "--publish", "x/y", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decisions"] == {"x/y": False}


def test_a_bad_line_exits_2_naming_the_file_and_line(tmp_path, capsys):
    requests = tmp_path / "bad.txt"
    requests.write_text("+a/#\n-a/b#\n")
    assert main(["subs", "replay", str(requests)]) == 2
    err = capsys.readouterr().err
    assert f"subs: {requests}: line 2: invalid pattern 'a/b#'" in err


def test_a_missing_file_exits_2(capsys):
    assert main(["subs", "replay", "/nonexistent/requests.txt"]) == 2
    assert "subs: no such file" in capsys.readouterr().err
