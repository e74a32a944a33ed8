"""No signal is ever lost, whenever it comes.

A signal is sent at many moments of a real `ask` on the bundled model, not at one lucky one: at 21
evenly spaced moments from the process's start to its `model:` line (Python's start-up, llmchat's
imports), the span measured on this machine just before the sweep so that a loaded machine is swept
as evenly as an idle one, and every 10 ms from 50 to 110 ms after the `model:` line (inside the
load, where llama.cpp calls back into Python thousands of times and a Ctrl-C used to vanish). Each run must end by the
signal: exit 130 (143 for SIGTERM) with one `llmchat:` line and no traceback, or, when the signal
beat llmchat's own code (Python's start-up), killed by it (or, inside Python's own imports, its
report and exit 1) with no line of llmchat's code in any traceback. Never exit 0 (unless Python's
start-up itself dropped the Ctrl-C, with its own report: `dropped_by_python`): the reply asked
for is greedy (a sampled one is often a single short sentence, done before the latest signal) and
runs to its 300-token cap, which takes far longer than the latest signal.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_robustness import assert_clean_failure, env_for, finish, wait_for_line

pytestmark = [pytest.mark.slow, pytest.mark.model]

# Greedy, this prompt runs SmolLM2 to the 300-token cap (a count stops after a few dozen tokens).
ESSAY = "Write a detailed essay on the history of Rome."
ASK = ("ask", "--no-history", "-t", "1", "--ctx", "512", "-n", "300", "--temp", "0", ESSAY)
AFTER_START_STEPS = 20  # moments from the start to the `model:` line: 21 of them
AFTER_MODEL_LINE_MS = range(50, 111, 10)
REPEATS = 3
# A traceback line that points into llmchat's own files.
LLMCHAT_FRAME = re.compile(r'File "[^"]*[/\\]llmchat[/\\]')


def start(home: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "llmchat", *ASK],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env_for(home),
    )


# Python's own start-up can drop a Ctrl-C before llmchat's handlers exist, in two places, each
# with its own report, and the run then goes on to its end:
# - its default handler raises KeyboardInterrupt inside importlib's module-lock weakref callback,
#   where CPython can only report it ("Exception ignored in: <function _get_module_lock.<locals>.cb
#   ...>") and go on. (With llmchat's handlers in, a raise dropped there is kept as pending by their
#   unraisable hook, reported by no such line, and ends the run with 130.)
# - it lands while `site` runs a `.pth` file (an editable install's finder) inside a class body's
#   `__set_name__`, which wraps it in a RuntimeError; `site` reports any Exception there ("Error
#   processing line N of ....pth", the chain naming the KeyboardInterrupt, "Remainder of file
#   ignored") and goes on.
DROPPED_IN_MODULE_LOCK = re.compile(
    r"Exception ignored in: <function _get_module_lock\.<locals>\.cb at 0x[0-9a-f]+>\n"
    r"Traceback \(most recent call last\):\n(  File \"<frozen [^>]+>\", line \d+, in \w+\n)+KeyboardInterrupt: \n"
)
DROPPED_IN_SITE = re.compile(
    r"Error processing line \d+ of [^\n]+\.pth:\n\n((  [^\n]*)?\n)*?\nRemainder of file ignored\n"
)


def dropped_by_python(stderr: str) -> bool:
    """Whether Python's start-up reported a Ctrl-C it dropped, first thing on stderr."""
    if DROPPED_IN_MODULE_LOCK.match(stderr):
        return True
    in_site = DROPPED_IN_SITE.match(stderr)
    return bool(in_site) and "KeyboardInterrupt" in in_site.group(0)


def assert_ended_by(result, sig: signal.Signals, code: int, word: str, when: str) -> None:
    where = f"signal {sig.name} {when}"
    if result.returncode == 0 and sig == signal.SIGINT and dropped_by_python(result.stderr):
        assert not LLMCHAT_FRAME.search(result.stderr), f"{where}: a traceback from llmchat's code: {result.stderr}"
        return
    assert result.returncode != 0, (
        f"{where}: exit 0 (the signal was lost); stdout: {result.stdout[:200]!r}; stderr: {result.stderr[-800:]!r}"
    )
    # Killed by the signal after llmchat's own line: CPython remembered a KeyboardInterrupt that
    # passed through exec'd code (llmchat.interrupts keeps it out of there), not Python's start-up.
    in_python_start_up = (result.returncode == -sig and "llmchat:" not in result.stderr) or (
        # Interrupted while Python imports `site` or `runpy`, before any of llmchat's code: Python
        # reports it ("Fatal Python error: init_import_site", "Could not import runpy module") and
        # exits 1.
        result.returncode == 1 and "llmchat:" not in result.stderr
    )
    if in_python_start_up:
        # The signal beat llmchat's handlers: Python's start-up, no llmchat code in the traceback.
        assert not LLMCHAT_FRAME.search(result.stderr), f"{where}: a traceback from llmchat's code: {result.stderr}"
        assert not result.stdout, f"{where}: an answer was written"
        return
    assert_clean_failure(result, code, word)


def start_to_model_line(home: Path) -> float:
    """Seconds from starting `ask` to its `model:` line, on this machine now (that run then ends
    by a SIGINT, one more moment checked)."""
    began = time.monotonic()
    proc = start(home)
    seen = wait_for_line(proc.stderr, "model:")
    span = time.monotonic() - began
    proc.send_signal(signal.SIGINT)
    assert_ended_by(finish(proc, stderr_head="".join(seen)), signal.SIGINT, 130, "interrupted", "at the model line")
    return span


def sweep_after_start(home: Path, sig: signal.Signals, code: int, word: str, steps: int, repeats: int) -> list:
    """`steps + 1` moments from the start to the `model:` line, `repeats` times."""
    span = start_to_model_line(home)
    outcomes = []
    for _ in range(repeats):
        for step in range(steps + 1):
            delay = span * step / steps
            began = time.monotonic()
            proc = start(home)
            time.sleep(max(0.0, began + delay - time.monotonic()))
            proc.send_signal(sig)
            result = finish(proc)
            assert_ended_by(result, sig, code, word, f"{delay * 1000:.0f} ms after start (of {span * 1000:.0f})")
            outcomes.append(result.returncode)
    return outcomes


def sweep_after_model_line(home: Path, sig: signal.Signals, code: int, word: str, delays_ms, repeats: int) -> list:
    outcomes = []
    for _ in range(repeats):
        for delay in delays_ms:
            proc = start(home)
            seen = wait_for_line(proc.stderr, "model:")
            time.sleep(delay / 1000)
            proc.send_signal(sig)
            result = finish(proc, stderr_head="".join(seen))
            assert_ended_by(result, sig, code, word, f"{delay} ms after the model line")
            outcomes.append(result.returncode)
    return outcomes


def test_sigint_from_start_to_load_is_never_lost(isolated_home):
    home = isolated_home
    outcomes = sweep_after_start(home, signal.SIGINT, 130, "interrupted", AFTER_START_STEPS, REPEATS)
    # The sweep reached llmchat's own handling (not only Python's start-up), for a third of the
    # moments at least: Python's start-up is a small part of the span however loaded the machine.
    assert outcomes.count(130) >= AFTER_START_STEPS + 1


def test_sigint_inside_the_model_load_is_never_lost(isolated_home):
    home = isolated_home
    outcomes = sweep_after_model_line(home, signal.SIGINT, 130, "interrupted", AFTER_MODEL_LINE_MS, REPEATS)
    assert set(outcomes) == {130}


def test_sigterm_from_start_to_load_is_never_lost(isolated_home):
    home = isolated_home
    sweep_after_start(home, signal.SIGTERM, 143, "terminated", AFTER_START_STEPS // 2, 1)
    sweep_after_model_line(home, signal.SIGTERM, 143, "terminated", AFTER_MODEL_LINE_MS, 1)


def test_the_unsignalled_run_outlasts_every_signal(isolated_home):
    """The sweeps' premise: without a signal, the greedy reply runs to its 300-token cap."""
    result = finish(start(isolated_home))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split()) >= 100, result.stdout


@pytest.fixture
def handlers_restored(monkeypatch):
    """install() in this process, undone afterwards: later tests expect Python's own handlers."""
    from llmchat import interrupts

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.setattr(interrupts, "_state", dict(interrupts._state, installed=False))
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_pending_signal_is_raised_at_the_next_safe_point(handlers_restored):
    """The mechanism itself: a signal that lands inside a native callback is recorded, not raised
    (an exception there would be dropped by ctypes), and raised at the next checkpoint."""
    from llmchat import interrupts

    interrupts.install()
    seen = []

    @interrupts.native_callback
    def callback() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        # The handler runs at the next bytecode boundary, still inside this function.
        for _ in range(1000):
            seen.append(interrupts.pending())

    callback()
    assert any(seen), "the signal was not recorded inside the callback"
    assert interrupts.pending()
    with pytest.raises(KeyboardInterrupt):
        interrupts.raise_pending()
    assert interrupts.pending(), "raised, but no longer recorded: a dropped raise would lose it"
    interrupts.consume()  # what the code that catches the Ctrl-C on purpose says
    assert not interrupts.pending()
    with pytest.raises(KeyboardInterrupt):  # outside a callback it raises at once, as Python's would
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
    interrupts.consume()
    assert not interrupts.pending()


def test_a_raise_that_is_dropped_is_raised_again():
    """CPython itself drops an exception in a few places (C code that runs Python and clears any
    error, reporting nothing): a SIGTERM's SystemExit that vanished there is raised again at the
    next checkpoint, and a SIGTERM is never consumed. A Ctrl-C is raised again until the code that
    caught it says so. (In a child process: the handlers and their record are process-wide.)"""
    script = """
import os, signal
from llmchat import interrupts
interrupts.install()

def dropped(signum):  # stands for the C code that swallows what the handler raised in it
    try:
        os.kill(os.getpid(), signum)
        for _ in range(1000):
            pass
    except BaseException as err:
        return type(err).__name__
    return "nothing raised"

print(dropped(signal.SIGINT))
try:
    interrupts.raise_pending()
except KeyboardInterrupt:
    print("raised again")
interrupts.consume()
assert not interrupts.pending()

print(dropped(signal.SIGTERM))
interrupts.consume()  # consumes a Ctrl-C only
for _ in range(2):
    try:
        interrupts.raise_pending()
    except SystemExit as err:
        print("exit", err.code)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:5] == ["KeyboardInterrupt", "raised again", "SystemExit", "exit 143", "exit 143"]


def test_a_signal_python_would_drop_is_kept():
    """Python reports an exception from a `__del__` as "unraisable" and drops it: a Ctrl-C landing
    in one is kept as pending by the hook `install()` adds, and raised at the next checkpoint.
    (In a child process: pytest swaps `sys.unraisablehook` around every test.)"""
    script = """
from llmchat import interrupts
interrupts.install()

class Finalized:
    def __del__(self):
        raise KeyboardInterrupt  # what the handler raises when the signal lands in here

Finalized()  # collected at once: its __del__ runs and its exception is unraisable
assert interrupts.pending(), "dropped"
try:
    interrupts.raise_pending()
except KeyboardInterrupt:
    print("raised")
interrupts.consume()
assert not interrupts.pending()
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "raised"
    assert "Exception ignored" not in result.stderr


def test_a_ctrl_c_inside_the_import_system_leaks_no_import_lock():
    """importlib takes the global import lock and only then enters the `try` that releases it (in
    `_get_module_lock` and in its module-lock weakref callback). A Ctrl-C raised between the two
    left the main thread holding that lock for good: every other thread then waited forever at its
    next import (a sweep above once hung after its `model:` line). Inside importlib's own code the
    signal is now only recorded, and raised at the next checkpoint.

    Made to happen, not hoped for: a helper thread holds the import lock while the main thread
    starts an import, so the main thread waits inside `_get_module_lock`; the helper sends SIGINT
    and lets go, and the handler runs just after the lock is taken. (In a child process, bounded by
    its timeout: the handlers are process-wide, and the bug is a hang.)"""
    script = """
import _imp, os, signal, sys, threading, time
from llmchat import interrupts

interrupts.install()
main = threading.main_thread().ident
started = threading.Event()

def hold_the_import_lock():
    _imp.acquire_lock()
    try:
        started.set()
        for _ in range(60_000):  # until the main thread waits for the lock (a minute at most)
            frame = sys._current_frames()[main]
            if frame.f_code.co_name == "_get_module_lock":
                break
            time.sleep(0.001)
        else:
            raise SystemExit("the main thread never waited in _get_module_lock")
        os.kill(os.getpid(), signal.SIGINT)  # recorded by the C handler; the main thread waits on
    finally:
        _imp.release_lock()

helper = threading.Thread(target=hold_the_import_lock)
helper.start()
started.wait()
try:
    import json.tool  # not imported yet: it asks for its module lock first
except KeyboardInterrupt as error:
    print("raised inside", error.__traceback__.tb_next.tb_frame.f_code.co_filename)
helper.join()
print("lock held", _imp.lock_held())
print("imported", "json.tool" in sys.modules)
try:
    interrupts.raise_pending()
except KeyboardInterrupt:
    print("raised at the checkpoint")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["lock held False", "imported True", "raised at the checkpoint"]


def test_a_ctrl_c_inside_code_exec_compiled_still_exits_130(tmp_path):
    """A KeyboardInterrupt that leaves the top level of source text compiled by exec() (dataclasses
    build their methods so, during an import) makes CPython 3.11 remember it, caught or not, and
    kill the process by SIGINT after its teardown instead of exiting 130. Such a signal is only
    recorded there, and the start-up's checkpoint after its imports ends the run: one line, exit
    130 exactly. Here `python -m llmchat` runs with a `sitecustomize` that execs source text which
    receives a SIGINT while the command line is imported."""
    (tmp_path / "sitecustomize.py").write_text(
        "import builtins\n"
        "real_import = builtins.__import__\n"
        "SOURCE = 'import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(1000):\\n    pass\\n'\n"
        "def importing(name, *args, **kwargs):\n"
        "    if name == 'llmchat.cli':\n"
        "        builtins.__import__ = real_import\n"
        "        exec(SOURCE, {})  # the handler runs in here, at the top level of exec'd text\n"
        "    return real_import(name, *args, **kwargs)\n"
        "builtins.__import__ = importing\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    result = subprocess.run(
        [sys.executable, "-m", "llmchat", "--version"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 130, (result.returncode, result.stderr)
    assert result.stderr.strip() == "llmchat: interrupted" and not result.stdout


def test_a_signal_that_python_wraps_during_an_import_is_still_one_line():
    """Python 3.11 wraps an exception raised while a class is created ("RuntimeError: Error calling
    __set_name__") around the KeyboardInterrupt of a Ctrl-C that lands there, in the middle of an
    import: the sweep from the start found one inside `import typer` (platform's `uname_result`).
    Such a Ctrl-C still ends in one line and exit 130. Here the class is created while llmchat's
    command line is imported, with a `__set_name__` that receives the signal."""
    script = """
import builtins, os, signal, sys
from llmchat import launch

class Trap:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode boundary, in here
            pass

real_import = builtins.__import__

def importing(name, *args, **kwargs):
    if name == "llmchat.cli":
        class Imported:
            trap = Trap()
    return real_import(name, *args, **kwargs)

builtins.__import__ = importing
sys.argv = ["llmchat", "--version"]
launch.main()
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "llmchat: interrupted" and not result.stdout


def test_signal_behind_finds_the_signal_in_a_wrapping_exception():
    from llmchat import interrupts

    wrapped = RuntimeError("Error calling __set_name__ on 'cached_property' instance 'processor'")
    wrapped.__cause__ = KeyboardInterrupt()
    assert interrupts.signal_behind(wrapped) == signal.SIGINT
    assert interrupts.signal_behind(RuntimeError("something else")) is None


def test_a_ctrl_c_inside_the_grammar_gate_leaves_its_pick_made(smollm2_path):
    """llama.cpp calls the grammar gate (a sampler written in Python) in the middle of sampling a
    token. A Ctrl-C landing in it is deferred: the gate makes its pick, the token is a valid one,
    and the KeyboardInterrupt comes at the next token. (Raised inside, ctypes would drop it halfway
    through the pick, and llama.cpp would read a candidate array no sampler chose.) In a child
    process: the handlers are process-wide."""
    script = """
import os, signal, sys
from dataclasses import replace
from llmchat import interrupts
from llmchat.engine import Engine, EngineSettings, grammar_gate
from llmchat.engine.grammar import Grammar, schema_to_gbnf
from llmchat.engine.interface import GenerateRequest
from llmchat.engine.sampling import SamplingParams
from llmchat.turn.structured import concise_to_schema

interrupts.install()
picks = []
original_pick = grammar_gate.GrammarGate._pick

def signal_then_pick(self, cur_p):
    picks.append(1)
    if len(picks) == 5:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10000):  # the handler runs here, inside llama.cpp's call of the gate
            pass
    original_pick(self, cur_p)

grammar_gate.GrammarGate._pick = signal_then_pick
engine = Engine.load(sys.argv[1], EngineSettings(n_ctx=512))
grammar = Grammar(schema_to_gbnf(concise_to_schema("title, year int")), "test")
sampling = replace(SamplingParams(), temperature=0.0, seed=1)
turn = "<|im_start|>user\\nThe film Alien, as JSON.<|im_end|>\\n<|im_start|>assistant\\n"
prompt = engine.prompt_tokens([(turn, True)])
texts = []
try:
    for event in engine.generate(GenerateRequest(prompt, sampling, max_tokens=40, grammar=grammar)):
        texts.append(event.text)
except KeyboardInterrupt:
    print("interrupted after", len(picks), "picks")
interrupts.consume()
print("".join(texts))
engine.close()
"""
    result = subprocess.run(
        [sys.executable, "-c", script, str(smollm2_path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    interrupted, text = result.stdout.split("\n", 1)
    assert interrupted == "interrupted after 5 picks", result.stdout
    assert text.lstrip().startswith("{") and '"title"' in text, text  # the grammar's own start
    assert "Exception ignored" not in result.stderr, result.stderr


def _frame_of(source: str, filename: str):
    """The frame that runs `source` as if it were the file `filename`."""
    namespace: dict = {}
    exec(compile(source + "\nimport sys\nframe = sys._getframe()", filename, "exec"), namespace)
    return namespace["frame"]


def test_a_signal_inside_the_import_system_is_deferred_frozen_or_not():
    """CPython runs importlib frozen (`<frozen importlib._bootstrap>`), or from its files where a
    build runs it unfrozen (`-X frozen_modules=off`, debug builds): inside either, a signal waits
    for the next checkpoint; in a module's own code, it is raised as anywhere."""
    from llmchat import interrupts

    for filename in (
        "<frozen importlib._bootstrap>",
        "/usr/lib/python3.13/importlib/_bootstrap.py",
        "/usr/lib/python3.13/importlib/_bootstrap_external.py",
    ):
        assert interrupts._inside_python_machinery(_frame_of("pass", filename)), filename
    assert not interrupts._inside_python_machinery(_frame_of("pass", "/home/user/project/module.py"))
    assert not interrupts._inside_python_machinery(_frame_of("pass", "/usr/lib/python3.13/importlib/metadata.py"))
