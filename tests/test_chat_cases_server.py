"""llama.cpp's reference cases through a real llama-server (the tests' own build): the server
streams each case's exact text (a grammar holds SmolLM2 to it), llmchat's llama-server client
takes the stream apart as it does in a turn, and the pieces it hands on give the same reading as
the text read whole in-process (tests/test_chat_cases.py checks that reading against llama.cpp's)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from servers import harness
from test_chat_cases import CASES, read_case

from llmchat.engine.grammar import Grammar
from llmchat.engine.interface import GenerateRequest
from llmchat.engine.remote import connect
from llmchat.engine.remote.spec import ServerSpec
from llmchat.engine.sampling import SamplingParams
from llmchat.tools.grammar import literal

pytestmark = [pytest.mark.server, pytest.mark.slow]

# Per template, its first case that calls a tool and its first that reasons (or its first case):
# a grammar-held reply decodes at a few tokens a second under load, so all 379 cases would take
# about half an hour of CI; these cover every template and every kind of reading.
BY_TEMPLATE: dict[str, list[dict]] = defaultdict(list)
for _case in CASES:
    kinds = {
        ("calls" if _case["expect"].get("tool_calls") else "")
        + ("thinks" if _case["expect"].get("reasoning_content") else "")
    }
    chosen = BY_TEMPLATE[_case["template"]]
    if not chosen or (kinds - {c.get("_kind") for c in chosen} and len(chosen) < 2 and "".join(kinds)):
        chosen.append({**_case, "_kind": next(iter(kinds))})


@pytest.fixture(scope="module")
def engine(smollm2_path, tmp_path_factory):
    server = harness.start_llama_server(smollm2_path, tmp_path_factory.mktemp("chat-cases-server"), ctx=4096)
    opened = connect(ServerSpec(url=server.url, kind="llama.cpp"))
    yield opened
    opened.close()
    server.stop()


def streamed(engine, text: str) -> list[str]:
    """The text as the server streams it, piece by piece, through llmchat's client."""
    # The text is in the prompt too: a model that has just read it tends to copy it, so the
    # grammar's fast path (the model's own pick is allowed) holds for most tokens.
    request = GenerateRequest(
        prompt=engine.tokenize(f"Copy this text exactly.\n{text}\nCopy:\n", special=False),
        sampling=SamplingParams(temperature=0.0, repeat_penalty=1.0, stop_loops=False, seed=1),
        max_tokens=len(text.encode("utf-8")) + 8,
        grammar=Grammar(f"root ::= {literal(text)}\n", "the case's exact text"),
    )
    return [token.text for token in engine.generate(request)]


@pytest.mark.parametrize("template", sorted(BY_TEMPLATE))
def test_each_case_streamed_by_llama_server_reads_as_in_process(engine, template):
    differences = []
    for case in BY_TEMPLATE[template]:
        pieces = streamed(engine, case["output"])
        assert "".join(pieces) == case["output"], case["id"]
        if read_case(case, pieces) != read_case(case, case["output"]):
            differences.append(case["id"])
    assert differences == [], f"read differently from the server's stream: {differences}"
