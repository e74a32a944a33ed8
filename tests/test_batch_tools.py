"""Tools in `llmchat batch` on the real SmolLM2: items that call a function through the tool loop,
plain items beside them, an item's own `tools` and `tool_choice`, the approval rule (nobody is at a
terminal), names checked before the load, --parallel and --resume.

A 135M model rarely calls a tool on its own, so the calls are forced (`tool_choice` naming the
function); `--chain-limit 1` keeps each tool item to one call and one answer. The functions append
to a file beside them, so the tests see exactly which calls ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llmchat.batch.items import parse_input

GREEDY = ("--temperature", "0", "--seed", "1", "--max-tokens", "32", "--chain-limit", "1")

FUNCTIONS = '''
import json
from pathlib import Path


def record_city(city: str) -> str:
    """Record a city and give its weather.

    Args:
        city: The city.
    """
    _log(city)
    return f"It is sunny in {city}, 21 degrees."


def add(a: int, b: int) -> str:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    _log([a, b])
    return str(a + b)


def _log(value) -> None:
    with open(Path(__file__).with_name("calls.txt"), "a", encoding="utf-8") as out:
        out.write(json.dumps(value) + "\\n")
'''

# The command line forces record_city; "plain" and "quiet" answer without tools; "sum" forces add.
ITEMS = [
    {"id": "weather", "prompt": "What is the weather in Paris?"},
    {"id": "plain", "prompt": "Name a colour.", "tools": []},
    {"id": "sum", "prompt": "What is 2 plus 3?", "tool_choice": "add"},
    {"id": "quiet", "prompt": "Say hello.", "tool_choice": "none"},
]
TOOL_OPTIONS = ("--tool-choice", "record_city", "--approve-tools")


def jsonl(*objects) -> str:
    return "".join(json.dumps(o) + "\n" for o in objects)


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def setup(folder: Path, items=ITEMS) -> tuple[Path, Path]:
    functions = folder / "batch_tools.py"
    functions.write_text(FUNCTIONS, encoding="utf-8")
    path = folder / "items.jsonl"
    path.write_text(jsonl(*items), encoding="utf-8")
    return functions, path


def calls_made(folder: Path) -> list:
    log = folder / "calls.txt"
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


def check_tool_record(record: dict, name: str) -> dict:
    """One call that ran, its result in the record, and a final answer in a second round that
    reused the first round's prompt."""
    assert record["error"] is None and isinstance(record["reply"], str)
    [call] = record["tool_calls"]
    assert call["name"] == name and call["approved"] is True and "error" not in call
    assert call["duration_s"] >= 0
    first, second = record["stats"]["rounds"]
    assert second["cached_tokens"] >= first["prompt_tokens"] > 0
    assert record["stats"]["generated_tokens"] == first["generated_tokens"] + second["generated_tokens"]
    return call


def check_records(got: list[dict], made: list) -> None:
    """The records of ITEMS: the two tool items called once each, with the arguments that ran."""
    assert [r["id"] for r in got] == [item["id"] for item in ITEMS]
    by_id = {r["id"]: r for r in got}
    city_call = check_tool_record(by_id["weather"], "record_city")
    sum_call = check_tool_record(by_id["sum"], "add")
    assert made == [city_call["arguments"]["city"], [sum_call["arguments"]["a"], sum_call["arguments"]["b"]]]
    assert city_call["result"] == f"It is sunny in {made[0]}, 21 degrees."
    assert sum_call["result"] == str(sum(made[1]))
    for plain in (by_id["plain"], by_id["quiet"]):
        assert plain["error"] is None and plain["reply"] and plain["tool_calls"] is None
        assert plain["stats"]["rounds"] is None


# --- items (no model) -------------------------------------------------------------------------------
def test_items_parse_their_tools_and_tool_choice():
    items = parse_input(
        jsonl(
            {"id": 1, "prompt": "p", "tools": ["a", "mcp:time"], "tool_choice": "a"},
            {"id": 2, "prompt": "p", "tools": "a"},
            {"id": 3, "prompt": "p", "tools": []},
            {"id": 4, "prompt": "p"},
            {"id": 5, "prompt": "p", "tools": [1]},
            {"id": 6, "prompt": "p", "tool_choice": ""},
            {"id": 7, "prompt": "p", "tools": {"a": 1}},
        ).encode()
    )
    got = {item.id: (item.tools, item.tool_choice, item.error) for item in items}
    assert got[1] == (["a", "mcp:time"], "a", None)
    assert got[2] == (["a"], None, None)
    assert got[3] == ([], None, None)
    assert got[4] == (None, None, None)
    assert "'tools' must be a list of tool names" in got[5][2]
    assert "'tool_choice' must be" in got[6][2]
    assert "'tools' must be a list of tool names" in got[7][2]


# --- checked before the load: exit 2, nothing run, nothing written --------------------------------
def test_without_approve_tools_nothing_runs(cli, tmp_path):
    functions, items = setup(tmp_path)
    out = tmp_path / "out.jsonl"
    run = cli("batch", str(items), "-o", str(out), "--functions", str(functions), "--tool-choice", "record_city")
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.strip().splitlines()
    assert "--approve-tools" in line and "record_city" in line and "add" in line
    assert not out.exists() and calls_made(tmp_path) == []  # no record, no side effect


def test_an_unknown_tool_in_an_item_stops_the_batch_before_the_load(cli, tmp_path):
    functions, items = setup(tmp_path, [*ITEMS, {"id": "bad", "prompt": "p", "tools": ["record_city", "nope"]}])
    out = tmp_path / "out.jsonl"
    run = cli("batch", str(items), "-o", str(out), "--functions", str(functions), *TOOL_OPTIONS)
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.strip().splitlines()  # no model line either: it never loaded
    assert line.startswith("llmchat: error: item \"bad\" (line 5): tools: no tool 'nope'")
    assert "record_city, add" in line
    assert not out.exists() and calls_made(tmp_path) == []


def test_bad_choices_and_combinations_name_the_item(cli, tmp_path):
    functions, _ = setup(tmp_path)
    cases = [
        ({"id": "x", "prompt": "p", "tools": ["add"], "tool_choice": "record_city"}, (), "tool_choice 'record_city'"),
        ({"id": "x", "prompt": "p", "tools": ["add"]}, TOOL_OPTIONS, "--tool-choice record_city is not one of"),
        ({"id": "x", "prompt": "p", "tools": [], "tool_choice": "add"}, (), "no tools are offered to it"),
        ({"id": "x", "prompt": "p", "schema": "name"}, TOOL_OPTIONS, "tools and a schema"),
    ]
    for item, options, message in cases:
        path = tmp_path / "one.jsonl"
        path.write_text(jsonl(item), encoding="utf-8")
        run = cli("batch", str(path), "--functions", str(functions), "--approve-tools", *options)
        assert run.returncode == 2, (item, run.stderr)
        [line] = run.stderr.strip().splitlines()
        assert 'item "x" (line 1)' in line and message in line, line
        assert run.stdout == ""
    plain = tmp_path / "plain.jsonl"
    plain.write_text(jsonl({"prompt": "p"}), encoding="utf-8")
    run = cli("batch", str(plain), "--tool-choice", "required")
    assert run.returncode == 2 and "no tools are offered" in run.stderr and run.stdout == ""


# --- the real model ---------------------------------------------------------------------------------
def test_tool_items_call_once_and_plain_items_are_unaffected(cli, tmp_path):
    functions, items = setup(tmp_path)
    run = cli("batch", str(items), "--functions", str(functions), *TOOL_OPTIONS, *GREEDY)
    assert run.returncode == 0, run.stderr
    got = records(run.stdout)
    check_records(got, calls_made(tmp_path))
    # Each call was shown on stderr before it ran, naming its item.
    assert 'item "weather": tool call: record_city(' in run.stderr
    assert 'item "sum": tool call: add(' in run.stderr
    assert "batch: done: 4/4 items (4 ok, 0 failed)" in run.stderr
    # The plain items got the reply a batch without tools gives them.
    plain_items = tmp_path / "plain.jsonl"
    plain_items.write_text(jsonl(*(item for item in ITEMS if item["id"] in ("plain", "quiet"))), encoding="utf-8")
    alone = cli("batch", str(plain_items), *GREEDY)
    assert alone.returncode == 0, alone.stderr
    replies = {r["id"]: r["reply"] for r in records(alone.stdout)}
    assert replies == {r["id"]: r["reply"] for r in got if r["id"] in ("plain", "quiet")}


def test_parallel_runs_tool_items_one_at_a_time_and_keeps_the_order(cli, tmp_path):
    functions, items = setup(tmp_path)
    out = tmp_path / "out.jsonl"
    run = cli(
        "batch", str(items), "-o", str(out), "--parallel", "2", "--functions", str(functions), *TOOL_OPTIONS, *GREEDY
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    got = records(out.read_text(encoding="utf-8"))
    check_records(got, calls_made(tmp_path))  # every id once, in input order; each call once
    assert "(parallel 2)" in run.stderr


def test_resume_runs_only_the_items_not_written(cli, tmp_path):
    functions, items = setup(tmp_path)
    out = tmp_path / "out.jsonl"
    # What an interrupted run leaves: the first tool item's record, and half of the next.
    done = {"id": "weather", "reply": "Sunny.", "finish_reason": "stop", "seed": 1, "stats": {}, "error": None}
    out.write_text(jsonl(done) + '{"id": "plain", "rep', encoding="utf-8")
    run = cli("batch", str(items), "-o", str(out), "--resume", "--functions", str(functions), *TOOL_OPTIONS, *GREEDY)
    assert run.returncode == 0, run.stderr
    got = records(out.read_text(encoding="utf-8"))
    assert [r["id"] for r in got] == ["weather", "plain", "sum", "quiet"]
    assert got[0] == done  # untouched, and its tool did not run again
    made = calls_made(tmp_path)
    assert len(made) == 1
    call = check_tool_record(got[2], "add")
    assert made == [[call["arguments"]["a"], call["arguments"]["b"]]]
    assert got[1]["tool_calls"] is None and got[3]["tool_calls"] is None


def test_an_item_may_name_a_configured_tool_that_approves_itself(cli, tmp_path, isolated_home):
    """`tools` names a [tools.NAME] the command line did not offer; its `approve = "always"` lets it
    run without --approve-tools."""
    log = tmp_path / "stamped.txt"
    script = tmp_path / "stamp.py"
    script.write_text(
        "import sys\n"
        f"open({str(log)!r}, 'a', encoding='utf-8').write(sys.argv[1] + '\\n')\n"
        "print('stamped ' + sys.argv[1])\n",
        encoding="utf-8",
    )
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        "[tools.stamp]\n"
        f"command = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, '{{word}}']\n"
        'description = "Stamp a word"\napprove = "always"\n'
        '[tools.stamp.parameters]\ntype = "object"\nrequired = ["word"]\n'
        '[tools.stamp.parameters.properties.word]\ntype = "string"\n',
        encoding="utf-8",
    )
    items = tmp_path / "items.jsonl"
    items.write_text(
        jsonl(
            {"id": 1, "prompt": "Stamp the word apple.", "tools": ["stamp"], "tool_choice": "stamp"},
            {"id": 2, "prompt": "Name a fruit."},
        ),
        encoding="utf-8",
    )
    run = cli("batch", str(items), *GREEDY)
    assert run.returncode == 0, run.stderr
    first, second = records(run.stdout)
    [word] = log.read_text(encoding="utf-8").splitlines()
    call = check_tool_record(first, "stamp")
    assert call["arguments"] == {"word": word} and call["result"] == f"stamped {word}\n"
    assert second["tool_calls"] is None


def test_item_tools_resolve_like_dash_t_or_to_offered_tools(tmp_path, isolated_home):
    """The resolution itself (no model): no `tools` gets the command line's; `mcp:SERVER` a server's
    tools (here one started with --mcp); a configured [tools.NAME] the command line did not offer is
    gathered too; `tool_choice` none answers without tools."""
    from llmchat.batch.tools import ItemTools, plan_tools
    from llmchat.config import load_config
    from llmchat.tools.options import tool_request

    functions, _ = setup(tmp_path)
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        '[tools.hello]\ncommand = ["echo", "hi"]\ndescription = "Say hi"\n', encoding="utf-8"
    )
    items = parse_input(
        jsonl(
            {"id": "all", "prompt": "p"},
            {"id": "time", "prompt": "p", "tools": ["mcp:time"], "tool_choice": "required"},
            {"id": "mixed", "prompt": "p", "tools": ["add", "hello", "add"], "tool_choice": "hello"},
            {"id": "none", "prompt": "p", "tool_choice": "none"},
            {"id": "empty", "prompt": "p", "tools": []},
        ).encode()
    )
    request = tool_request(
        None, [str(functions)], ["mcp-server-time --local-timezone UTC"], "auto", 5, True, offered_elsewhere=True
    )
    plan = plan_tools(request, items, None, load_config())
    assert plan is not None
    try:
        time_tools = ("time_get_current_time", "time_convert_time")
        got = {item.id: plan.for_item(item) for item in items}
        assert got["all"] == ItemTools(("record_city", "add", *time_tools), "auto")
        assert got["time"] == ItemTools(time_tools, "required")
        assert got["mixed"] == ItemTools(("add", "hello"), "hello")
        assert got["none"] is None and got["empty"] is None
        assert plan.specs["hello"].source == "config:tools.hello"  # gathered for the item alone
    finally:
        plan.close()


def test_a_failing_tool_is_text_for_the_model_and_an_item_that_cannot_fit_fails(cli, tmp_path):
    functions, _ = setup(tmp_path)
    functions.write_text(
        FUNCTIONS + '\n\ndef explode(reason: str) -> str:\n    """Fail.\n\n    Args:\n        reason: Why.\n    """\n'
        "    _log(reason)\n    raise RuntimeError('the fuse blew')\n",
        encoding="utf-8",
    )
    items = tmp_path / "items.jsonl"
    items.write_text(
        jsonl(
            {"id": "long", "prompt": "Weather? " + "alpha beta gamma delta " * 150, "tool_choice": "record_city"},
            {"id": "boom", "prompt": "Blow the fuse.", "tool_choice": "explode"},
        ),
        encoding="utf-8",
    )
    run = cli("batch", str(items), "--ctx", "512", "--functions", str(functions), "--approve-tools", *GREEDY)
    assert run.returncode == 1, run.stderr  # one item failed
    long, boom = records(run.stdout)
    assert long["error"] and "context" in long["error"] and long["reply"] is None
    assert boom["error"] is None and isinstance(boom["reply"], str)
    [call] = boom["tool_calls"]
    assert call["name"] == "explode" and call["approved"] is True
    assert call["error"] == "RuntimeError: the fuse blew" and "result" not in call
    assert len(calls_made(tmp_path)) == 1  # only the explode call ran
    assert 'item "boom": tool call explode failed: RuntimeError: the fuse blew' in run.stderr
    assert "1 of 2 items failed" in run.stderr


def test_ctrl_c_in_a_tool_item_stops_the_batch_and_resume_finishes_it(tmp_path):
    """Ctrl-C while a tool item runs (its call made, its answer being prefilled): the batch stops
    (exit 130) with whole records only and none for that item; --resume runs it again and the
    rest, each id once, in order.

    The Ctrl-C lands there every time: a sitecustomize in the batch's process (tests/shims.py)
    holds the first llama_decode after the call ran until the signal comes, and says so with a file."""
    import os
    import signal
    import subprocess
    import time

    from tests.shims import decode_shim, sitecustomize_env

    functions, items = setup(tmp_path)
    out = tmp_path / "out.jsonl"
    entered = tmp_path / "answer-decode-entered"
    shim = decode_shim(
        setup=f"_calls = pathlib.Path({str(tmp_path / 'calls.txt')!r})\n_entered = pathlib.Path({str(entered)!r})",
        on_decode="""
if _calls.exists() and not _entered.exists():  # the first decode of the answer, after the call ran
    _entered.write_text("")
    for _ in range(60000):  # held until the test's Ctrl-C raises here (bounded: 10 minutes)
        time.sleep(0.01)
""",
    )
    args = [sys.executable, "-m", "llmchat", "batch", str(items), "-o", str(out), "--progress", "off"]
    args += ["--functions", str(functions), *TOOL_OPTIONS, *GREEDY]
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=sitecustomize_env(tmp_path / "shim", shim),
    )
    for _ in range(36000):  # a bound against a hang (30 minutes), not a time limit: it ends at the event
        if entered.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert entered.exists(), proc.communicate()[1].decode("utf-8", "replace")
    assert len(calls_made(tmp_path)) == 1  # the weather item's call ran; its answer is next
    proc.send_signal(signal.SIGINT)
    stderr = proc.communicate(timeout=1800)[1].decode("utf-8", "replace")  # bounds a hang only
    assert 'item "weather": tool call: ' in stderr
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    data = out.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    assert all(r["finish_reason"] != "interrupted" for r in records(data.decode("utf-8")))  # none half-answered
    resumed = subprocess.run([*args, "--resume"], capture_output=True, env=dict(os.environ), timeout=1800)
    assert resumed.returncode == 0, resumed.stderr
    got = records(out.read_text(encoding="utf-8"))
    assert [r["id"] for r in got] == [item["id"] for item in ITEMS]
    made = calls_made(tmp_path)
    assert len(made) == 3  # the interrupted item's call, then each tool item's once
    check_records(got, made[-2:])
