"""What MCP servers return as files (images, audio, blobs) is part of a conversation: private
(0600 in a 0700 folder, whatever the umask), removed with the last conversation that names it
(`history rm`, /undo, `history rm --all`), and never left on disk by a chat that is not saved
(`--no-history`: a temporary folder that goes at exit). A blob attached with `-f mcp:SERVER/URI`
is taken as bytes and not written at all.

The server is tests/data/mcp/media_server.py (the SDK's MCPServer as a real process); the runs
with the model force the call (`--tool-choice`), so nothing rests on what the model writes.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from llmchat.store.history import HistoryStore

SERVER = Path(__file__).resolve().parent / "data" / "mcp" / "media_server.py"
FORCED = ("--temperature", "0", "--seed", "1", "--max-tokens", "48", "--chain-limit", "1", "--approve-tools")
SUBPROCESS_TIMEOUT_S = 300  # only a guard against a hung child, never an assertion


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def media_home(isolated_home: Path) -> Path:
    """A home whose config names the media server [mcp.media]."""
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        f"[mcp.media]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(str(SERVER))}]\n", encoding="utf-8"
    )
    return isolated_home


def run_llmchat(*args: str, umask: int = 0o022) -> subprocess.CompletedProcess:
    """`python -m llmchat ARGS` as a user with this umask would run it."""
    return subprocess.run(
        [sys.executable, "-m", "llmchat", *args],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        preexec_fn=lambda: os.umask(umask),
    )


def call_picture(umask: int = 0o022) -> Path:
    """`llmchat mcp call media picture`: the path of the saved image."""
    run = run_llmchat("mcp", "call", "media", "picture", "--json", umask=umask)
    assert run.returncode == 0, run.stderr
    [block] = json.loads(run.stdout)["blocks"]
    return Path(block["path"])


# --------------------------------------------------------------------------- no model


def test_an_mcp_image_is_private_whatever_the_umask(media_home):
    media = media_home / "cache" / "mcp"
    media.mkdir(parents=True)
    media.chmod(0o755)  # as an earlier llmchat left it under umask 022
    image = call_picture(umask=0o022)
    assert image.parent == media
    assert image.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert (mode(media), mode(image)) == (0o700, 0o600)
    run = run_llmchat("mcp", "call", "media", "recording", "--json", umask=0o002)
    assert run.returncode == 0, run.stderr
    [block] = json.loads(run.stdout)["blocks"]
    assert mode(Path(block["path"])) == 0o600


def test_a_blob_attached_from_a_server_is_taken_as_bytes_and_not_saved(media_home):
    from llmchat.config import load_config
    from llmchat.tools.mcp.sources import McpSources
    from llmchat.turn.attachments import collect

    with McpSources(load_config()) as sources:
        (attachment,) = collect(["mcp:media/note://blob"], resources=sources.resource_bytes)
    assert attachment.text == "A note kept as a blob, private."
    assert sorted(path.name for path in media_home.rglob("*")) == ["config.toml"]  # no copy of it anywhere


def seed_tool_turn(store: HistoryStore, image: Path, question: str) -> str:
    """A conversation whose tool turn got `image`, as the tool loop stores one."""
    conversation = store.new_conversation(
        model="smollm2", model_path="/m.gguf", template="chatml", system_prompt=None, sampling={}
    )
    placeholder = f"[image image/png, 70 bytes, saved to {image}]"
    calls = [{"id": "call00000", "type": "function", "function": {"name": "media_picture", "arguments": {}}}]
    store.add_turn(
        conversation,
        question,
        "Here it is.",
        tool_messages=[
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": placeholder, "tool_call_id": "call00000", "name": "media_picture"},
        ],
    )
    return conversation


def saved_image(stem: str, data: bytes) -> Path:
    """An image saved by the writer every MCP result goes through."""
    import base64

    from llmchat import paths
    from llmchat.tools.mcp.results import save_media

    return save_media(base64.b64encode(data).decode(), "image/png", paths.mcp_media_dir(), stem).path


def test_an_image_goes_with_the_last_conversation_that_names_it(media_home):
    shared = saved_image("media_picture", b"\x89PNG shared")
    alone = saved_image("media_picture", b"\x89PNG alone")
    undone = saved_image("media_picture", b"\x89PNG undone")
    with HistoryStore.open() as store:
        first = seed_tool_turn(store, shared, "Show me the picture.")
        second = seed_tool_turn(store, alone, "Another picture?")
        store.add_turn(second, "The first one again", f"It is still at {shared}.")  # a reply naming a file
        branch = store.fork(first, 1)  # a branch holds a copy of the turn, and so names the file too
        store.delete(first)
        assert shared.exists()  # still named by the branch and by `second`
        store.delete(branch)
        assert shared.exists()  # still named by `second`'s reply
        store.add_turn(second, "And one more", "", tool_messages=[{"role": "tool", "content": f"saved to {undone}"}])
        store.delete_last_exchange(second)  # /undo of the turn that alone named `undone`
        assert not undone.exists() and alone.exists()
        store.delete(second)
    assert not shared.exists() and not alone.exists()


def test_history_rm_all_removes_every_mcp_file(media_home):
    image = call_picture()  # outside any conversation: `mcp call`
    with HistoryStore.open() as store:
        seed_tool_turn(store, saved_image("media_picture", b"\x89PNG kept"), "Show me.")
    run = run_llmchat("history", "rm", "--all", "--yes")
    assert run.returncode == 0, run.stderr
    assert not image.parent.exists()


# --------------------------------------------------------------------------- with the model


def ask_for_picture(model: Path, *args: str) -> dict:
    run = run_llmchat(
        "ask", "-m", str(model), *FORCED, "-T", "mcp:media", "--tool-choice", "media_picture", "--json", *args,
        "Show me the picture.",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_an_image_an_ask_got_is_private_and_goes_with_its_conversation(media_home, smollm2_path):
    record = ask_for_picture(smollm2_path)
    [call] = record["tool_calls"]
    image = Path(call["result"].removeprefix("[image image/png, 70 bytes, saved to ").removesuffix("]"))
    assert image.parent == media_home / "cache" / "mcp"
    assert (mode(image.parent), mode(image)) == (0o700, 0o600)
    with HistoryStore.open() as store:
        tool_message = [m for m in store.get(record["conversation_id"]).messages if m.role == "tool"]
    assert [m.content for m in tool_message] == [call["result"]]
    run = run_llmchat("history", "rm", record["conversation_id"], "--yes")
    assert run.returncode == 0, run.stderr
    assert not image.exists()


def test_no_history_keeps_an_image_only_while_the_run_lasts(media_home, smollm2_path):
    record = ask_for_picture(smollm2_path, "--no-history")
    [call] = record["tool_calls"]
    image = Path(call["result"].removeprefix("[image image/png, 70 bytes, saved to ").removesuffix("]"))
    assert call["result"].startswith("[image image/png, 70 bytes, saved to ")
    assert media_home not in image.parents
    assert not image.exists() and not image.parent.parent.exists()  # the run's temporary folder went at exit
    assert not (media_home / "cache" / "mcp").exists()
