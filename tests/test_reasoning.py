"""Reasoning models: formats found from real templates, the streaming parser, template variables,
the thinking budget on a real model, KV reuse with reasoning templates, and where thinking goes.

The templates in tests/data/templates/ are the upstream ones (each has a .source note). The model
is the real SmolLM2 carrying them with --template: it does not think as a reasoning model would,
but a prompt that ends in an open <think> makes whatever it writes thinking until the block closes,
which is what the budget and the parser must handle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmchat.prompt.model_facts import ModelFacts
from llmchat.prompt.render import render_prompt
from llmchat.prompt.resolution import resolve_template
from llmchat.reasoning.formats import (
    ANSWER,
    THINKING,
    ReasoningSettings,
    detect_format,
    parse_template_var,
    starts_in_thinking,
    thinking_variables,
)
from llmchat.reasoning.thinking import ThinkingSplitter, ThinkingTracker, split_reply
from llmchat.turn.conversation import Conversation
from llmchat.turn.plan import TurnScope
from llmchat.turn.record import TurnResult, error_record

TEMPLATES = Path(__file__).parent / "data" / "templates"
QWEN3 = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"
QWQ = TEMPLATES / "Qwen-QwQ-32B.jinja"
R1 = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
GPT_OSS = TEMPLATES / "openai-gpt-oss-120b.jinja"
SMOLLM3 = TEMPLATES / "HuggingFaceTB-SmolLM3-3B.jinja"
THINK_TAG = re.compile(r"</?think>")
FACTS = ModelFacts(bos_token="<s>", eos_token="</s>")


def _render(path: Path, messages: list[dict], variables: dict | None = None) -> str:
    resolved = resolve_template(FACTS, str(path))
    return render_prompt(resolved, messages, FACTS, variables=variables).text


def _tags():
    fmt = detect_format(QWEN3.read_text())
    assert fmt is not None
    return fmt


def _harmony():
    fmt = detect_format(GPT_OSS.read_text())
    assert fmt is not None
    return fmt


# --------------------------------------------------------------------------- detection


def test_every_real_template_has_a_sidecar_naming_its_source():
    for template in TEMPLATES.glob("*.jinja"):
        note = template.with_name(template.name + ".source").read_text()
        assert "models/templates" in note or "chat_template" in note, template.name


@pytest.mark.parametrize(
    ("path", "kind", "switch", "effort"),
    [
        (QWEN3, "tags", "enable_thinking", None),
        (QWQ, "tags", None, None),
        (R1, "tags", None, None),
        (SMOLLM3, "tags", "enable_thinking", None),
        (GPT_OSS, "harmony", None, "reasoning_effort"),
    ],
)
def test_format_is_found_from_the_real_template(path, kind, switch, effort):
    fmt = detect_format(path.read_text())
    assert fmt is not None
    assert (fmt.kind, fmt.switch, fmt.effort) == (kind, switch, effort)


def test_other_tag_pairs_come_from_the_vocabulary_and_plain_models_have_none():
    fmt = detect_format("{{ messages }}", vocabulary={"[THINK]", "[/THINK]"})
    assert fmt is not None and (fmt.open_tag, fmt.close_tag) == ("[THINK]", "[/THINK]")
    assert detect_format("{{ messages }}", vocabulary={"<think>", "</think>"}).open_tag == "<think>"
    assert detect_format("<|im_start|>{{ messages }}", vocabulary={"<|im_start|>"}) is None


@pytest.mark.parametrize(("path", "open_"), [(R1, True), (QWQ, True), (QWEN3, False), (SMOLLM3, False)])
def test_start_state_comes_from_the_rendered_generation_prompt(path, open_):
    prompt = _render(path, [{"role": "user", "content": "Hi"}])
    fmt = detect_format(path.read_text())
    assert starts_in_thinking(fmt, prompt) is open_


# --------------------------------------------------------------------------- template variables


def test_enable_thinking_reaches_the_qwen3_and_smollm3_templates():
    messages = [{"role": "user", "content": "Hi"}]
    assert _render(QWEN3, messages, {"enable_thinking": False}).endswith("<think>\n\n</think>\n\n")
    assert "<think>" not in _render(QWEN3, messages, {"enable_thinking": True})
    assert "Reasoning Mode: /no_think" in _render(SMOLLM3, messages, {"enable_thinking": False})
    assert "Reasoning Mode: /think" in _render(SMOLLM3, messages, {"enable_thinking": True})
    # Switched off, the prompt closes the block itself: the reply starts as the answer.
    fmt = detect_format(QWEN3.read_text())
    assert not starts_in_thinking(fmt, _render(QWEN3, messages, {"enable_thinking": False}))


def test_reasoning_effort_reaches_the_gpt_oss_template():
    messages = [{"role": "user", "content": "Hi"}]
    said: list[str] = []
    variables = thinking_variables(_harmony(), None, "high", said.append)
    assert variables == {"reasoning_effort": "high"} and not said
    assert "Reasoning: high" in _render(GPT_OSS, messages, variables)
    assert "Reasoning: medium" in _render(GPT_OSS, messages)


def test_a_template_without_a_switch_says_so_instead_of_ignoring_no_think():
    said: list[str] = []
    assert thinking_variables(detect_format(R1.read_text()), False, None, said.append) == {}
    assert len(said) == 1 and "cannot switch thinking off" in said[0]
    said.clear()
    assert thinking_variables(_harmony(), False, None, said.append) == {}
    assert "reasoning-effort low" in said[0]
    said.clear()
    thinking_variables(None, True, None, said.append)
    assert "no thinking mode" in said[0]
    said.clear()
    assert thinking_variables(_tags(), False, None, said.append) == {"enable_thinking": False} and not said


def test_template_var_values_are_json_when_they_can_be():
    assert parse_template_var("enable_thinking=false") == ("enable_thinking", False)
    assert parse_template_var("n=3") == ("n", 3)
    assert parse_template_var("model_identity=You are Bob") == ("model_identity", "You are Bob")
    from llmchat.errors import UsageError

    for bad in ("novalue", "1x=2", "messages=[]"):
        with pytest.raises(UsageError):
            parse_template_var(bad)


def test_settings_refuse_contradictions_and_take_config_defaults():
    from types import SimpleNamespace

    from llmchat.errors import UsageError
    from llmchat.options import RunOptions

    config = SimpleNamespace(think=False, reasoning_effort=None, thinking_budget=64, hide_thinking=True)
    settings = ReasoningSettings.from_options(RunOptions(), config)
    assert (settings.think, settings.budget, settings.display) == (False, 64, "hide")
    flags = RunOptions(think=True, thinking_budget=8, show_thinking=True, template_var=("x=1",))
    settings = ReasoningSettings.from_options(flags, config)
    assert (settings.think, settings.budget, settings.display, settings.variables) == (True, 8, "stdout", (("x", 1),))
    for opts in (
        RunOptions(hide_thinking=True, show_thinking=True),
        RunOptions(thinking_budget=-1),
        RunOptions(reasoning_effort="max"),
    ):
        with pytest.raises(UsageError):
            ReasoningSettings.from_options(opts)


def test_the_config_file_takes_reasoning_preserve(tmp_path):
    """The manual names `reasoning_preserve` as --reasoning-preserve's config key: a real config
    file with it loads, and the flag still wins over it."""
    from llmchat.config import load_config
    from llmchat.options import RunOptions

    path = tmp_path / "config.toml"
    path.write_text("reasoning_preserve = true\n")
    config = load_config(path)
    assert ReasoningSettings.from_options(RunOptions(), config).preserve is True
    assert ReasoningSettings.from_options(RunOptions(reasoning_preserve=False), config).preserve is False
    assert ReasoningSettings.from_options(RunOptions(), load_config(tmp_path / "none.toml")).preserve is False


# --------------------------------------------------------------------------- the streaming parser


def _feed_all(splitter: ThinkingSplitter, pieces: list[str]) -> list[tuple[str, str]]:
    segments = []
    for piece in pieces:
        segments += splitter.feed(piece)
    segments += splitter.flush()
    return [(s.kind, s.text) for s in segments]


def test_tags_split_anywhere_across_tokens_are_found():
    reply = "<think>\nstep one</think>\n\nThe answer."
    for cut_a in range(len(reply) + 1):
        for cut_b in range(cut_a, len(reply) + 1, 3):
            splitter = ThinkingSplitter(_tags())
            _feed_all(splitter, [reply[:cut_a], reply[cut_a:cut_b], reply[cut_b:]])
            assert (splitter.reasoning, splitter.answer) == ("step one", "The answer."), (cut_a, cut_b)


def test_one_character_at_a_time_streams_thinking_then_answer():
    splitter = ThinkingSplitter(_tags())
    segments = _feed_all(splitter, list("<think>abc</think>\n\nxyz"))
    kinds = [kind for kind, _ in segments]
    assert kinds == sorted(kinds, key=lambda k: k == ANSWER)  # all thinking first, then all answer
    assert "".join(t for k, t in segments if k == THINKING) == "abc"
    assert "".join(t for k, t in segments if k == ANSWER) == "xyz"


def test_open_think_in_the_prompt_means_the_reply_starts_as_thinking():
    reasoning, answer = split_reply(_tags(), "\nweighing it</think>\n\nFour.", start_in_thinking=True)
    assert (reasoning, answer) == ("weighing it", "Four.")


def test_a_block_that_never_closes_is_all_thinking_and_no_answer():
    assert split_reply(_tags(), "still thinking when it stopped", start_in_thinking=True) == (
        "still thinking when it stopped",
        "",
    )
    assert split_reply(_tags(), "  <think>cut off") == ("cut off", "")


def test_an_answer_that_talks_about_the_tags_is_left_alone():
    text = "Use <think> and </think> to mark it."
    assert split_reply(_tags(), text) == ("", text)


def test_a_second_close_tag_moves_the_text_before_it_into_the_reasoning():
    # The templates read a reply as content.split('</think>')[-1]; so does the parser.
    reasoning, answer = split_reply(_tags(), "a</think>\n\nnot yet\n</think>\n\nFinal.", start_in_thinking=True)
    assert answer == "Final." and "not yet" in reasoning and not THINK_TAG.search(answer)


def test_a_close_tag_inside_a_tool_call_is_the_calls_text():
    # Once a call has opened after the thinking, a `</think>` in an argument is argument text,
    # streamed a character at a time as well as whole (llama.cpp's Ling 3.0 case).
    reply = "weighing\n</think>\n<tool_call>f\n<arg_value>has </think> in it</arg_value></tool_call>"
    for pieces in ([reply], list(reply)):
        splitter = ThinkingSplitter(_tags(), start_in_thinking=True, call_openers=("<tool_call>",))
        _feed_all(splitter, pieces)
        assert splitter.reasoning == "weighing"
        assert splitter.answer == reply.split("</think>\n", 1)[1]
    # Without tools offered a second close tag still moves the text before it into the reasoning.
    reasoning, answer = split_reply(_tags(), reply, start_in_thinking=True)
    assert answer == "in it</arg_value></tool_call>" and "<tool_call>" in reasoning


def test_a_repeated_channel_opener_is_not_the_answers_text():
    template = Path(__file__).parent / "data" / "chat_cases" / "templates" / "google-gemma-4-31B-it.jinja"
    gemma4 = detect_format(template.read_text(encoding="utf-8"))
    assert gemma4 is not None and gemma4.open_tag == "<|channel>thought"
    reply = "<|channel><|channel>thought\n<channel|>Hello."
    for pieces in ([reply], list(reply)):
        splitter = ThinkingSplitter(gemma4)
        _feed_all(splitter, pieces)
        assert (splitter.reasoning, splitter.answer.strip()) == ("", "Hello.")
    # A reply that only begins like the opener is left alone.
    assert split_reply(gemma4, "<|channel>x")[1] == "<|channel>x"


def test_harmony_channels_split_into_analysis_and_final():
    pieces = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "User greets. ",
        "Reply politely.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "final",
        "<|mess",
        "age|>",
        "Hello!",
        "<|return|>",
    ]
    splitter = ThinkingSplitter(_harmony())
    segments = _feed_all(splitter, pieces)
    assert splitter.reasoning == "User greets. Reply politely."
    assert splitter.answer == "Hello!"
    assert not any("<|" in text or "final" in text for _, text in segments)


def test_harmony_prompt_ending_in_the_analysis_header_starts_as_thinking():
    fmt = _harmony()
    assert starts_in_thinking(fmt, "<|start|>assistant<|channel|>analysis<|message|>")
    assert split_reply(fmt, "hmm<|end|><|start|>assistant<|channel|>final<|message|>Hi", start_in_thinking=True) == (
        "hmm",
        "Hi",
    )


def test_the_budget_forces_the_close_once_after_n_tokens_or_at_an_early_end():
    tracker = ThinkingTracker(ThinkingSplitter(_tags(), start_in_thinking=True), budget=4, close_ids=[7, 8])
    tracker.feed("one two", 3, 0.0)
    assert tracker.forced_tokens(3) == ()
    assert tracker.forced_tokens(4) == [7, 8] and tracker.budget_hit
    assert tracker.forced_tokens(5) == ()  # once
    early = ThinkingTracker(ThinkingSplitter(_tags(), start_in_thinking=True), budget=50, close_ids=[7])
    assert early.forced_tokens(2) == ()
    assert early.forced_tokens(2, ending=True) == [7] and not early.budget_hit
    unbudgeted = ThinkingTracker(ThinkingSplitter(_tags(), start_in_thinking=True), close_ids=[7])
    assert unbudgeted.forced_tokens(1000, ending=True) == ()


# --------------------------------------------------------------------------- records and history


def test_record_keys_are_the_same_for_results_and_errors():
    from llmchat.turn.metrics import TurnStats

    result = TurnResult("q", "a", "stop", TurnStats(), 1, reasoning="r")
    assert tuple(result.to_record(1)) == tuple(error_record(1, "bad"))
    assert result.to_record()["reasoning"] == "r" and error_record(1, "x")["reasoning"] is None


def test_earlier_reasoning_goes_back_only_where_the_template_shows_it():
    conversation = Conversation()
    conversation.add_exchange("What is 2+2?", "4")
    conversation.messages[-1]["reasoning"] = "SECRET-CHAIN two and two"
    messages = conversation.prompt_messages("And 3+3?")
    # As llama.cpp passes it: the template decides (llmchat.prompt.reasoning_history).
    assert messages[1] == {"role": "assistant", "content": "4", "reasoning_content": "SECRET-CHAIN two and two"}
    # Qwen3 drops thinking before the last user message; R1 and SmolLM3 never read it (SmolLM3
    # would keep raw <think> text in content, which never holds it).
    for path in (QWEN3, R1, SMOLLM3):
        assert "SECRET-CHAIN" not in _render(path, messages)


def test_history_keeps_reasoning_in_its_own_column_and_shows_it_marked(isolated_home):
    from llmchat.store.export import export_json, export_markdown
    from llmchat.store.history import HistoryStore

    with HistoryStore.open() as store:
        cid = store.new_conversation(model="m", model_path="/m.gguf", template="t", system_prompt=None, sampling={})
        store.add_turn(cid, "What is 2+2?", "4", reasoning="two and two\nmake four")
        store.add_turn(cid, "Hi", "Hello")
        conv = store.get(cid)
        columns = [row[1] for row in store._db.execute("PRAGMA table_info(messages)")]
    assert "reasoning" in columns
    assert [m.reasoning for m in conv.messages] == [None, "two and two\nmake four", None, None]
    assert conv.messages[1].content == "4"
    markdown = export_markdown(conv)
    assert "### Reasoning\n\n> two and two\n> make four\n\n### Answer\n\n4" in markdown
    assert json.loads(export_json(conv))["messages"][1]["reasoning"] == "two and two\nmake four"


# --------------------------------------------------------------------------- on the real model


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, smollm2_path):
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCHAT_HOME", str(tmp_path_factory.mktemp("reasoning-home")))
        mp.delenv("LLMCHAT_MODEL", raising=False)
        result = load_model(
            RunOptions(ctx=4096, temperature=0.0, seed=1, max_tokens=48), config=load_config(), announce=False
        )
    yield result
    result.engine.close()


def _session(loaded, template: Path, settings: ReasoningSettings | None = None, system: str | None = None):
    from llmchat.turn.session import ChatSession

    session = ChatSession.start(
        loaded.engine,
        sampling=loaded.sampling,
        model_label=loaded.model.name,
        template_choice=str(template),
        system=system,
    )
    said: list[str] = []
    session.configure_reasoning(settings or ReasoningSettings(), said.append)
    return session, said


def test_budget_forces_an_answer_on_a_real_model(loaded):
    budget, max_tokens = 8, 48
    session, _ = _session(loaded, R1, ReasoningSettings(budget=budget))
    result = session.turn("Think step by step: what is 17 + 25?")
    assert result.reasoning and result.reply.strip(), result
    assert not THINK_TAG.search(result.reply)
    stats = result.stats
    assert stats.thinking_budget_hit  # greedy SmolLM2 writes more than 8 tokens before any close
    assert stats.thinking_tokens >= budget and stats.answer_tokens > 0
    assert stats.thinking_tokens + stats.answer_tokens == stats.generated_tokens <= budget + max_tokens
    assert 0 < stats.ttft_s < stats.ttfa_s
    # The close was forced into the reply's tokens: the model answered after it.
    assert "</think>" in loaded.engine.detokenize(session.engine.evaluated_tokens())


def test_kv_reuse_over_five_turns_with_a_reasoning_template(loaded):
    session, _ = _session(loaded, R1, ReasoningSettings(budget=6), system="You are a careful assistant. " * 12)
    cached, prompts = [], []
    for question in ("Name a fruit.", "Name a colour.", "Name an animal.", "Name a city.", "Name a tool."):
        result = session.turn(question, record=False)
        assert result.reasoning is not None and not THINK_TAG.search(result.reply)
        cached.append(result.stats.cached_tokens)
        prompts.append(result.stats.prompt_tokens)
    # Earlier thinking is dropped from the re-rendered prompt, yet everything up to the last reply
    # is reused: the cached prefix grows every turn and nothing is prefilled in full again.
    assert all(later > earlier for earlier, later in zip(cached, cached[1:])), cached
    assert all(c >= p // 2 for c, p in zip(cached[1:], prompts[1:])), (cached, prompts)


def test_ten_turn_chat_with_the_qwen3_template_reuses_at_least_80_percent(loaded):
    system = "You are a helpful assistant who answers briefly and plainly, in one short sentence. " * 4
    session, _ = _session(loaded, QWEN3, system=system)
    assert session.reasoning_format is not None and session.reasoning_format.switch == "enable_thinking"
    ratios = []
    for number in range(1, 11):
        result = session.turn(f"Question {number}: name one thing that is blue.", record=False)
        assert not THINK_TAG.search(result.reply)
        ratios.append(result.stats.cached_tokens / result.stats.prompt_tokens)
    assert all(ratio >= 0.8 for ratio in ratios[1:]), ratios


def test_no_think_reaches_the_prompt_through_the_session(loaded):
    session, said = _session(loaded, QWEN3, ReasoningSettings(think=False))
    prepared = session.prepare("Hi")
    assert not said and not prepared.starts_thinking
    assert loaded.engine.detokenize(prepared.prompt).endswith("<think>\n\n</think>\n\n")
    session.set_thinking(True, said.append)
    assert not loaded.engine.detokenize(session.prepare("Hi").prompt).endswith("</think>\n\n")
    r1, said = _session(loaded, R1, ReasoningSettings(think=False))
    assert len(said) == 1 and "cannot switch thinking off" in said[0]


@pytest.mark.model
def test_ask_json_acceptance_and_no_reasoning_on_stdout_by_default(cli, smollm2_path):
    common = ["--template", str(R1), "--temp", "0", "--seed", "1", "-n", "64", "--no-history"]
    question = "Think step by step: what is 17 + 25?"
    done = cli("ask", "--json", "--thinking-budget", "32", *common, question)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert set(record) == set(error_record(None, ""))
    assert record["reasoning"] and record["reply"], record
    assert not THINK_TAG.search(record["reply"])
    stats = record["stats"]
    assert stats["ttft_s"] > 0 and stats["ttfa_s"] >= stats["ttft_s"]
    assert stats["thinking_tokens"] > 0 and stats["answer_tokens"] > 0

    plain = cli("ask", "--thinking-budget", "32", *common, question)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == record["reply"].strip()
    assert record["reasoning"] not in plain.stdout and not THINK_TAG.search(plain.stdout)

    shown = cli("ask", "--show-thinking", "--thinking-budget", "32", *common, question)
    assert shown.stdout.startswith("<thinking>\n") and "\n</thinking>\n\n" in shown.stdout
    assert shown.stdout.split("\n</thinking>\n\n", 1)[1].strip() == record["reply"].strip()


def test_budget_in_parallel_decoding_matches_the_serial_rules(loaded):
    """batch --parallel decodes with ParallelDecoder; a prepared turn's tracker steers each slot."""
    from llmchat.engine.interface import QueuedRequest
    from llmchat.engine.parallel import ParallelDecoder

    budget = 8
    session, _ = _session(loaded, R1, ReasoningSettings(budget=budget))
    questions = ("Think step by step: what is 17 + 25?", "Think step by step: what is 9 * 7?")
    prepared = {i: session.prepare(q, TurnScope(conversation=Conversation())) for i, q in enumerate(questions)}
    results = {}

    def on_done(done):
        p = prepared[done.key]
        results[done.key] = session.finish(p, done.outcome, done.text, done.seed, t_submit=done.t_submit)

    items = [QueuedRequest(i, session.request_for(p)) for i, p in prepared.items()]
    ParallelDecoder(loaded.engine, 2, 1024).run(items, on_done)
    for result in results.values():
        assert result.reasoning and result.reply.strip() and not THINK_TAG.search(result.reply), result
        assert result.stats.thinking_budget_hit and result.stats.thinking_tokens >= budget
        assert result.stats.ttfa_s is not None and result.stats.ttfa_s > result.stats.ttft_s


# --------------------------------------------------------------------------- display


class _Terminal:
    """A text stream that says it is a terminal (what StreamPrinter checks), keeping what it got."""

    def __init__(self, tty: bool = True):
        self.tty = tty
        self.written: list[str] = []

    def write(self, text: str) -> int:
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.tty

    def fileno(self) -> int:
        raise OSError("not a real terminal")

    @property
    def text(self) -> str:
        return "".join(self.written)


def test_thinking_streams_dimmed_on_a_terminals_stderr_and_the_answer_on_stdout():
    from llmchat.output import DIM, StreamPrinter

    out, err = _Terminal(tty=False), _Terminal()
    printer = StreamPrinter(out, err, show_live=False, show_summary=False)
    printer.prefill_started(10, 0, 100)
    printer.thinking("weighing it")
    printer.text("Four.")
    assert out.text == "Four."
    assert f"{DIM}weighing it" in err.text and err.text.endswith("\n\n")  # the answer starts apart


def test_thinking_is_not_printed_where_stderr_is_not_a_terminal():
    from llmchat.output import StreamPrinter

    out, err = _Terminal(tty=False), _Terminal(tty=False)
    printer = StreamPrinter(out, err, show_live=False, show_summary=False)
    printer.prefill_started(10, 0, 100)
    printer.thinking("weighing it")
    printer.text("Four.")
    assert out.text == "Four." and err.text == ""


def test_the_live_readout_shows_the_thinking_phase():
    from llmchat.output import StreamPrinter, format_live

    printer = StreamPrinter(_Terminal(tty=False), _Terminal(tty=False), show_live=False, show_summary=False)
    printer.prefill_started(10, 0, 100)
    printer.thinking("a")
    printer.token(312, 0.0, 1.0)
    assert re.fullmatch(r"thinking… 312 tokens, \d+\.\d s", format_live(printer._state))
    printer.text("answer")
    assert format_live(printer._state).startswith("TTFT")


def test_slash_think_and_nothink_switch_the_template_variable(loaded):
    from llmchat.ui import slash
    from llmchat.ui.context import CommandContext

    session, _ = _session(loaded, QWEN3)
    errors, infos = [], []
    ctx = CommandContext(session, out=None, error=errors.append, info=infos.append)
    slash.dispatch("/nothink", ctx)
    assert session.template_vars == {"enable_thinking": False} and infos[-1].startswith("thinking off")
    slash.dispatch("/think", ctx)
    assert session.template_vars == {"enable_thinking": True} and not errors
    r1, _ = _session(loaded, R1)
    slash.dispatch("/nothink", CommandContext(r1, out=None, error=errors.append, info=infos.append))
    assert "cannot switch thinking off" in errors[-1]
