"""llama.cpp failing in the middle of a reply (a decode that returns an error), on the real engine.

The failure is injected into llama.cpp's binding only: in `ask`, by a sitecustomize in the
child process (tests/shims.py) that makes `llama_decode` return an error at the Nth decode step;
in the chat, by wrapping the binding in this process. Either way the turn ends as a Ctrl-C's
does: the reply so far is shown and saved, marked interrupted; then one `ModelError` line (exit 3
in `ask`), never a traceback.
"""

from __future__ import annotations

import json

from llmchat.errors import ExitCode
from tests.shims import decode_shim, sitecustomize_env

PROMPT = "Count from 1 to 50, separated by spaces."
FAIL_AT_STEP = 12  # the 12th one-token decode step: 11 reply tokens were sampled before it

# The failing step returns -3, llama.cpp's "the graph could not be computed".
FAILING_DECODE = decode_shim(on_decode=f"if batch.n_tokens == 1 and calls == {FAIL_AT_STEP}:\n    result = -3")


def test_a_decode_failure_in_ask_is_one_line_and_keeps_the_reply_so_far(cli, smollm2_path, tmp_path):
    env = sitecustomize_env(tmp_path / "shim", FAILING_DECODE)
    run = cli("ask", "-m", str(smollm2_path), "--temperature", "0", "-n", "64", PROMPT, env=env)
    assert run.returncode == int(ExitCode.MODEL) == 3, run.stderr
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("llmchat: error: llama.cpp failed mid-reply (llama_decode returned -3)"), lines[0]
    shown = run.stdout.strip()
    assert shown, "the reply so far is printed"
    history = cli("history", "show", "last", "--json")
    assert history.returncode == 0, history.stderr
    user, reply = json.loads(history.stdout)["messages"]
    assert user["content"] == PROMPT
    assert reply["interrupted"] is True and reply["finish_reason"] == "interrupted"
    assert reply["content"].strip() == shown, "the history holds what was printed"


def test_a_decode_failure_in_batch_fails_that_item_only(cli, smollm2_path, tmp_path):
    """The failure hits the first item's reply; the next items decode as usual (the KV cache is
    cut back to what llama.cpp evaluated)."""
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": n, "prompt": PROMPT}) + "\n" for n in range(2)), encoding="utf-8")
    env = sitecustomize_env(tmp_path / "shim", FAILING_DECODE)
    run = cli("batch", str(items), "-m", str(smollm2_path), "--temperature", "0", "-n", "16", env=env)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    first, second = (json.loads(line) for line in run.stdout.splitlines())
    assert first["error"].startswith("llama.cpp failed mid-reply (llama_decode returned -3)")
    assert second["error"] is None and second["reply"]


def test_a_decode_failure_in_the_chat_keeps_the_reply_and_the_chat_goes_on(monkeypatch, capsys, tmp_path):
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from llmchat.config import load_config
    from llmchat.engine.bindings import llama_cpp
    from llmchat.options import RunOptions
    from llmchat.startup.loading import load_model
    from llmchat.store.history import HistoryStore
    from llmchat.turn.session import ChatSession
    from llmchat.ui.chat import run_interactive

    loaded = load_model(
        RunOptions(ctx=1024, temperature=0.0, seed=1, max_tokens=64), config=load_config(), announce=False
    )
    real_decode = llama_cpp.llama_decode
    steps = []

    def failing_decode(ctx, batch):
        if batch.n_tokens == 1:
            steps.append(1)
            if len(steps) == FAIL_AT_STEP:
                return -3
        return real_decode(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", failing_decode)
    store = HistoryStore.open()
    session = ChatSession.start(loaded.engine, sampling=loaded.sampling, model_label="smollm2", history=store)
    try:
        with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
            pipe.send_text(PROMPT + "\r" + "Say hello.\r" + "\x04")
            run_interactive(session, show_stats=False, markdown=False, verbose=False)
        out, err = capsys.readouterr()
        errors = [line for line in err.splitlines() if "error" in line]
        assert errors == [errors[0]] and "llama.cpp failed mid-reply (llama_decode returned -3)" in errors[0], err
        assert "Traceback" not in err
        messages = [(m["role"], m["content"], bool(m.get("interrupted"))) for m in session.conversation.messages]
        assert [m[0] for m in messages] == ["user", "assistant", "user", "assistant"], "the chat went on"
        assert messages[1][2] is True and messages[1][1].strip(), "the reply so far, marked interrupted"
        assert messages[1][1].strip() in out
        assert messages[3][2] is False and messages[3][1].strip()
        stored = [(m.role, m.content, m.interrupted) for m in store.get(session.conversation_id).messages]
        assert stored == messages
    finally:
        store.close()
        loaded.engine.close()
