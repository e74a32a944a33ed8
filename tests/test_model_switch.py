"""`/model NAME`: the same conversation on another model (llmchat.turn.model_switch, ChatSession.switch_model).

The engines are real: SmolLM2 first, then Gemma 3 270M (no template in its metadata: llmchat picks
its built-in `gemma`). Replies are never compared as text; the records, stats, history rows and
notices are. The history's `model` column (m009_message_model) is tested on an old database too.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmchat.errors import LlmchatError
from llmchat.store.export import export_json, export_markdown
from llmchat.store.history import HistoryStore
from llmchat.store.migrations import MIGRATIONS
from llmchat.turn.model_switch import SWITCHED

GEMMA_LABEL = "gemma-3-270m-q4_k_m"
ENTER = "\r"


def _start(model: Path, *, history: bool = True, max_tokens: int = 8):
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    options = RunOptions(model=str(model), ctx=1024, temperature=0.0, seed=1, max_tokens=max_tokens)
    return start_session(options, config=load_config(), overflow="drop", with_history=history)


# --------------------------------------------------------------------------- the session


def test_switch_keeps_the_conversation_and_rebuilds_the_prefix(smollm2_path, gemma_path, monkeypatch):
    import llmchat.startup.loading

    session = _start(smollm2_path)
    try:
        first = session.turn("Name a colour.")
        smollm2_label, smollm2_template = session.model_label, session.template.name
        old = session.engine

        # The old engine is still loaded when the new one has finished loading.
        alive_after_load: list[bool] = []
        real_load = llmchat.startup.loading.load_model

        def watched(*args, **kwargs):
            loaded = real_load(*args, **kwargs)
            alive_after_load.append(old.model.ctx is not None)
            return loaded

        monkeypatch.setattr(llmchat.startup.loading, "load_model", watched)
        said: list[str] = []
        session.switch_model(str(gemma_path), said.append)
        assert alive_after_load == [True]
        assert old.model.model is None and old.model.ctx is None, "the old engine is freed after the switch"
        assert session.engine is not old
        assert said == [f"warning: {GEMMA_LABEL} is a base model: its replies continue your text"]
        assert (session.model_label, session.template.name, session.template.source) == (
            GEMMA_LABEL,
            "gemma",
            "builtin",
        )
        assert len(session.conversation.messages) == 2, "the conversation goes on"
        assert all("token_ids" not in m for m in session.conversation.messages), "old vocabulary's ids dropped"

        second = session.turn("Name another.")
        record = second.to_record()
        assert (record["model"], record["template"]) == (GEMMA_LABEL, "gemma")
        assert record["stats"]["prefix"] == SWITCHED and record["stats"]["cached_tokens"] == 0
        assert f"prefix {SWITCHED}" in second.stats.summary()
        alone = session.tokenize_messages([{"role": "user", "content": "Name another."}])
        assert second.stats.prompt_tokens > len(alone), "the first exchange is in the new model's prompt"

        third = session.turn("And one more.")
        assert third.stats.prefix is None and third.stats.cached_tokens > 0, "the new prefix is reused again"
        assert first.to_record()["stats"]["prefix"] is None
        assert (first.model, first.template) == (smollm2_label, smollm2_template)

        stored = session.history.get(session.conversation_id)
        assert [(m.role, m.model) for m in stored.messages] == [
            ("user", None),
            ("assistant", smollm2_label),
            ("user", None),
            ("assistant", GEMMA_LABEL),
            ("user", None),
            ("assistant", GEMMA_LABEL),
        ]
        assert stored.messages[3].stats["prefix"] == SWITCHED
    finally:
        session.close()


def test_a_model_that_cannot_load_leaves_the_current_one(smollm2_path, tmp_path):
    session = _start(smollm2_path, history=False)
    try:
        engine, label, template = session.engine, session.model_label, session.template
        not_gguf = tmp_path / "notes.gguf"
        not_gguf.write_text("not a model")
        for name in ("/no/such.gguf", str(not_gguf), "no-such-model-name"):
            with pytest.raises(LlmchatError) as caught:
                session.switch_model(name, lambda line: None)
            assert "\n" not in str(caught.value)
            assert (session.engine, session.model_label, session.template) == (engine, label, template)
        result = session.turn("Hello.")
        assert result.model == label and result.stats.generated_tokens > 0, "the next message answers, on the old model"
        assert result.stats.prefix is None
    finally:
        session.close()


def test_the_new_models_recommended_sampling_replaces_the_old_ones(smollm2_path, isolated_home, tmp_path):
    """The old model's `general.sampling.*` values give way to the new model's (or to ours where it
    recommends none); a flag, the config, `-p NAME` and `/set` stay. Seen in /show, in the line
    /model prints, and in the sampling the next reply is decoded with."""
    from io import StringIO

    from gguf_copies import with_recommended_sampling
    from rich.console import Console

    from llmchat.options import RunOptions
    from llmchat.ui import slash
    from llmchat.ui.context import CommandContext

    first = with_recommended_sampling(smollm2_path, tmp_path / "first.gguf", temp=0.25, top_k=7, min_p=0.2)
    second = with_recommended_sampling(smollm2_path, tmp_path / "second.gguf", temp=0.9, top_k=3)
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text(
        '[sampling]\nrepeat_penalty = 1.3\n\n[prompts.terse]\nsystem = "Be terse."\ntop_p = 0.6\n'
    )
    options = RunOptions(model=str(first), ctx=1024, seed=1, max_tokens=4, saved_prompt="terse")
    session = _start_with(options)
    try:
        out, said = StringIO(), []
        ctx = CommandContext(session=session, out=Console(file=out, width=200), error=said.append, info=said.append)

        def shown(name: str) -> tuple[object, str]:
            return getattr(session.sampling, name), session.sampling.source_of(name)

        assert shown("temperature") == (0.25, "model") and shown("top_k") == (7, "model")
        slash.dispatch("/set min_p 0.1", ctx)
        slash.dispatch("/model " + str(second), ctx)
        assert any(
            line.startswith("sampling for second: ") and "temperature 0.25 -> 0.9 (model)" in line for line in said
        ), said
        assert shown("temperature") == (0.9, "model") and shown("top_k") == (3, "model")
        assert shown("min_p") == (0.1, "/set")
        assert shown("top_p") == (0.6, "prompt terse") and shown("repeat_penalty") == (1.3, "config")
        assert (shown("seed"), shown("max_tokens")) == ((1, "flag"), (4, "flag"))

        slash.dispatch("/show", ctx)
        table = out.getvalue()
        assert re.search(r"temperature\s+0\.9\s+model", table) and re.search(r"top_k\s+3\s+model", table), table

        used = []
        real_generate = session.engine.generate

        def watched(request):
            used.append(request.sampling)
            return real_generate(request)

        session.engine.generate = watched
        session.turn("Hello.")
        assert [(s.temperature, s.top_k, s.min_p, s.top_p) for s in used] == [(0.9, 3, 0.1, 0.6)]

        # Back to a model that recommends nothing: its values are ours again.
        session.switch_model(str(smollm2_path), lambda line: None)
        assert shown("temperature") == (0.7, "default") and shown("top_k") == (40, "default")
        assert shown("min_p") == (0.1, "/set") and shown("top_p") == (0.6, "prompt terse")
    finally:
        session.close()


def _start_with(options):
    from llmchat.config import load_config
    from llmchat.startup.loading import start_session

    return start_session(options, config=load_config(), overflow="drop", with_history=False)


TOOL = '''
from pathlib import Path


def record_city(city: str) -> str:
    """Record a city.

    Args:
        city: The city.
    """
    with open(Path(__file__).with_name("calls.txt"), "a", encoding="utf-8") as out:
        out.write(city + "\\n")
    return "recorded"
'''


def test_tools_are_offered_again_in_the_new_models_format(smollm2_path, gemma_path, tmp_path):
    from llmchat.tools.functions import load_functions
    from llmchat.tools.offer import ToolIO, make_offer

    (tmp_path / "city_tool.py").write_text(TOOL, encoding="utf-8")
    specs = load_functions(str(tmp_path / "city_tool.py"))
    session = _start(smollm2_path, history=False, max_tokens=48)  # room for the whole call
    try:
        io = ToolIO(show_call=lambda line: None, notice=lambda line: None)
        session.use_tools(make_offer(session, specs, io, tool_choice="record_city", approve_all=True, chain_limit=1))
        before = session.tools
        session.switch_model(str(gemma_path), lambda line: None)
        after = session.tools
        assert after is not None and after is not before
        assert list(after.specs) == ["record_city"] and after.choice == before.choice
        assert after.policy is before.policy, "approvals carry over"
        # The forced first round is held to the new model's call grammar: the call parses and runs.
        result = session.turn("Record Paris.")
        assert [call.name for call in result.tool_calls or []] == ["record_city"]
        assert len((tmp_path / "calls.txt").read_text().splitlines()) == 1
        assert result.stats.prefix == SWITCHED
    finally:
        session.close()


# --------------------------------------------------------------------------- completion


def _link_models(home: Path, *models: Path) -> None:
    folder = home / "models"  # llmchat's own models folder (paths.models_dir) under LLMCHAT_HOME
    folder.mkdir(parents=True, exist_ok=True)
    for model in models:
        os.symlink(model, folder / model.name)


def test_completion_offers_the_names_models_list_shows(isolated_home, smollm2_path, gemma_path, cli):
    from prompt_toolkit.document import Document

    from llmchat.config import load_config
    from llmchat.ui.completer import SlashCompleter

    _link_models(isolated_home, smollm2_path, gemma_path)
    listed = cli("models", "list", env={"COLUMNS": "300"})  # wide enough that no name is folded
    assert listed.returncode == 0, listed.stderr
    # Completion is pure UI logic: it needs only the session's config.
    completer = SlashCompleter(SimpleNamespace(config=load_config(), history=None))

    def words(text: str) -> list[str]:
        return [c.text for c in completer.get_completions(Document(text), None)]

    names = words("/model ")
    assert len(names) == 2 and all(name in listed.stdout for name in names), (names, listed.stdout)
    assert words("/model gem") == [gemma_path.stem] and words("/model GEM") == [gemma_path.stem]
    assert words("/model smol") == [smollm2_path.stem]
    assert set(words("/mo")) == {"/model", "/models"}
    folder = str(isolated_home / "models") + "/"
    assert sorted(words("/model " + folder)) == sorted([smollm2_path.name, gemma_path.name]), "a path completes too"


# --------------------------------------------------------------------------- the history column


def test_old_database_gains_the_model_column_with_old_rows_unknown(tmp_path):
    path = tmp_path / "history.db"
    before = [fn for fn in MIGRATIONS if fn.__name__ != "m009_message_model"]
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    from llmchat.store import migrations

    migrations.migrate(db, before[: [fn.__name__ for fn in before].index("m006_tool_messages") + 1])
    db.execute(
        "INSERT INTO conversations (id, name, model, model_path, template, sampling_json, created_at, updated_at)"
        " VALUES ('01old', 'kept', 'm', '/m.gguf', 'chatml', '{}', 't0', 't0')"
    )
    db.execute(
        "INSERT INTO messages (conversation_id, seq, role, content, created_at) VALUES"
        " ('01old', 0, 'user', 'hi', 't0'), ('01old', 1, 'assistant', 'hello', 't0')"
    )
    db.execute("COMMIT")
    db.close()

    with HistoryStore.open(path) as store:
        assert [m.model for m in store.get("kept").messages] == [None, None], "old rows: unknown, not guessed"
        store.add_turn("01old", "again", "reply", model="other-model")
        conversation = store.get("kept")
    assert [m.model for m in conversation.messages] == [None, None, None, "other-model"]
    assert '"model": "other-model"' in export_json(conversation)
    headings = [line for line in export_markdown(conversation).splitlines() if line.startswith("## ")]
    assert headings == ["## User", "## Assistant", "## User", "## Assistant (other-model)"]


def test_history_show_names_a_reply_whose_model_changed(isolated_home, cli):
    with HistoryStore.open() as store:  # under the test's LLMCHAT_HOME
        cid = store.new_conversation(model="A", model_path="/a.gguf", template="t", system_prompt=None, sampling={})
        for model in ("A", "B", "B", "A"):
            store.add_turn(cid, "question", "answer", model=model)
        branch = store.fork(cid, 2)
    shown = cli("history", "show", cid)
    assert shown.returncode == 0, shown.stderr
    assert re.findall(r"^## Assistant.*$", shown.stdout, re.M) == [
        "## Assistant",
        "## Assistant (B)",
        "## Assistant",
        "## Assistant (A)",
    ]
    exported = cli("history", "export", branch, "--format", "json")
    assert exported.returncode == 0, exported.stderr
    assert re.findall(r'"model": "(\w)"', exported.stdout) == ["A", "A", "B"], "a branch keeps who wrote what"


# --------------------------------------------------------------------------- a real terminal


def test_model_command_in_a_pseudo_terminal(isolated_home, smollm2_path, gemma_path):
    import pexpect  # a declared test dependency (pyproject.toml)

    env = dict(
        os.environ,
        LLMCHAT_HOME=str(isolated_home),
        TERM="xterm-256color",
        PROMPT_TOOLKIT_NO_CPR="1",
        COLUMNS="100",
        LINES="30",
    )
    env.pop("LLMCHAT_MODEL", None)
    _link_models(isolated_home, gemma_path)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "llmchat", "chat", "-m", str(smollm2_path), "--temperature", "0", "--max-tokens", "8", "--ctx", "1024"],
        env=env,
        encoding="utf-8",
        codec_errors="replace",
        dimensions=(30, 100),
        timeout=180,
    )
    summary = r"prompt \d+ \(\d+ cached\) · ctx \d+/\d+"
    try:
        child.expect_exact("/help for commands")
        child.expect_exact("> ")
        child.send("Name a colour." + ENTER)
        child.expect(summary)
        child.expect_exact("> ")
        child.send("/model gem")
        child.expect_exact(gemma_path.stem)  # the completion menu offers the name `llmchat models list` shows
        child.send("\t")  # Tab takes it
        child.expect_exact(gemma_path.stem)
        child.send(ENTER + ENTER)  # the first Enter closes the menu, the second sends the line
        child.expect_exact(f"{GEMMA_LABEL} · template gemma (builtin) · ctx 1,024")
        child.expect_exact("the conversation goes on (1 turn, its prompt built anew)")
        child.expect_exact("> ")
        child.send("Name another." + ENTER)
        child.expect(r"prompt \d+ \(0 cached\) · ctx \d+/\d+ · [^\n]*prefix rebuilt after model switch")
        child.expect_exact("> ")
        child.send("/model /no/such.gguf" + ENTER)
        child.expect_exact(f"; still on {GEMMA_LABEL}")
        child.expect_exact("> ")
        child.send("And one more." + ENTER)
        child.expect(summary)
        child.expect_exact("> ")
        child.send("/model" + ENTER)
        child.expect_exact(f"{GEMMA_LABEL} · template gemma (builtin)")
        child.expect_exact("> ")
        child.send("/models" + ENTER)
        child.expect_exact("name (/model NAME)")
        child.expect_exact("> ")
        child.send("/exit" + ENTER)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    with HistoryStore.open() as store:
        stored = store.get("last")
    replies = [m.model for m in stored.messages if m.role == "assistant"]
    assert replies == [smollm2_path.stem, GEMMA_LABEL, GEMMA_LABEL]
    assert stored.model == smollm2_path.stem
