"""A one-shot `ask` begins llama.cpp's load on a thread of its own while its start-up goes on
(llmchat.engine.load_ahead): the model is opened once, there; a start-up that stops before the
load is taken (a bad option) cancels it and frees everything it made; a load asked with other
settings than the one begun opens its own and frees the other.

Real loads of the bundled model, counted through the ledger of tests/test_engine_cleanup.py.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time

import pytest

from llmchat.engine.bindings import llama_cpp
from llmchat.env import Environment
from tests.test_engine_cleanup import Ledger

pytestmark = pytest.mark.model

THREAD = "llmchat-load-ahead"


@pytest.fixture
def ledger(monkeypatch) -> Ledger:
    return Ledger(monkeypatch)


@pytest.fixture
def load_began(monkeypatch) -> list[float]:
    """The monotonic time at which each `llama_model_load_from_file` call began."""
    times: list[float] = []
    real = llama_cpp.llama_model_load_from_file

    def recorded(*args):
        times.append(time.monotonic())
        return real(*args)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", recorded)
    return times


@pytest.fixture
def busy_readings(monkeypatch) -> list:
    """The CPU reading each thread count was chosen `since` (engine.threads.thread_tuner)."""
    from llmchat.engine import core

    readings: list = []
    real = core.thread_tuner

    def recorded(fixed, most, all_on_gpu, contexts, since):
        readings.append(since)
        return real(fixed, most, all_on_gpu, contexts, since)

    monkeypatch.setattr(core, "thread_tuner", recorded)
    return readings


@pytest.fixture
def load_threads(monkeypatch) -> list[str]:
    """The name of the thread each `llama_model_load_from_file` call ran on."""
    names: list[str] = []
    real = llama_cpp.llama_model_load_from_file

    def recorded(*args):
        names.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", recorded)
    return names


def _ask(*args: str) -> tuple[int, str, str]:
    from llmchat.cli import main

    env = Environment(
        stdin=io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8"),
        stdout=io.StringIO(),
        stderr=io.StringIO(),
        stdin_isatty=False,
        stdout_isatty=False,
        stderr_isatty=False,
    )
    with pytest.raises(SystemExit) as done:
        main(["ask", "--no-history", "-n", "4", "--temp", "0", *args], env)
        raise SystemExit(0)
    assert isinstance(env.stdout, io.StringIO) and isinstance(env.stderr, io.StringIO)
    return int(done.value.code or 0), env.stdout.getvalue(), env.stderr.getvalue()


def _no_load_thread_left() -> bool:
    return not any(thread.name == THREAD for thread in threading.enumerate())


def test_a_one_shot_opens_its_model_once_on_the_load_ahead_thread(isolated_home, smollm2_path, load_threads, ledger):
    code, out, err = _ask("-m", str(smollm2_path), "Say hello.")
    assert code == 0, err
    assert out.strip(), "a reply"
    assert load_threads == [THREAD]  # begun ahead and taken: not opened a second time
    ledger.assert_all_freed()
    assert _no_load_thread_left()


def test_a_one_shot_reads_other_processes_over_the_load_begun_ahead(
    isolated_home, smollm2_path, load_began, busy_readings
):
    # The busy-machine check compares the CPU use at the end of the load with a reading taken as
    # it began: one taken before this command (when a module was imported) or after the load
    # ahead already ran would not see the load at all, and a busy machine would go unnoticed.
    started = time.monotonic()
    code, _, err = _ask("-m", str(smollm2_path), "Say hello.")
    assert code == 0, err
    assert len(load_began) == 1 and len(busy_readings) == 1
    assert started <= busy_readings[0].wall <= load_began[0]


def test_verbose_opens_the_model_in_order_on_the_main_thread(isolated_home, smollm2_path, load_threads):
    code, _, err = _ask("-m", str(smollm2_path), "--verbose", "Say hello.")
    assert code == 0, err
    assert load_threads == ["MainThread"]  # llama.cpp's log stays in order with the run's own lines


def test_a_check_that_fails_during_the_load_cancels_it_and_frees_what_it_made(
    isolated_home, smollm2_path, load_threads, ledger
):
    code, out, err = _ask("-m", str(smollm2_path), "--schema", "{not json", "Say hello.")
    assert code == 2, err
    assert err.startswith("llmchat: error:") and "schema" in err and len(err.strip().splitlines()) == 1
    assert out == ""
    assert load_threads == [THREAD]  # it was begun before the schema was read
    assert _no_load_thread_left()
    made, freed = sum(ledger.made.values()), sum(ledger.freed.values())
    assert made == freed  # the model and its context when the load had got that far; else nothing


def test_a_load_with_other_settings_opens_its_own_and_frees_the_one_begun(smollm2_path, load_threads, ledger):
    from dataclasses import replace

    from llmchat.engine import Engine, EngineSettings, load_ahead

    begun = EngineSettings(n_ctx=256, threads=1, flash_attn=False)
    load_ahead.begin(smollm2_path, begun)
    engine = Engine.load(smollm2_path, replace(begun, n_ctx=512))
    try:
        assert engine.n_ctx == 512
        assert load_threads == [THREAD, "MainThread"]
        assert _no_load_thread_left()
    finally:
        engine.close()
    ledger.assert_all_freed()


def test_cancel_stops_a_load_in_flight_and_frees_it(smollm2_path, ledger):
    from llmchat.engine import EngineSettings, load_ahead

    load_ahead.begin(smollm2_path, EngineSettings(n_ctx=256, threads=1, flash_attn=False))
    load_ahead.cancel()
    load_ahead.cancel()  # nothing left: a second cancel does nothing
    assert _no_load_thread_left()
    assert ledger.calls["llama_model_load_from_file"] == 1
    made, freed = sum(ledger.made.values()), sum(ledger.freed.values())
    assert made == freed


# Records, at the process's exit, every module imported by a thread other than the main one.
THREAD_IMPORTS = (
    "import atexit, runpy, sys, threading\n"
    "imports = []\n"
    "class Recorder:\n"
    "    @staticmethod\n"
    "    def find_spec(name, path=None, target=None):\n"
    "        if threading.current_thread() is not threading.main_thread():\n"
    "            imports.append(threading.current_thread().name + ':' + name)\n"
    "        return None  # the real finders import it\n"
    "sys.meta_path.insert(0, Recorder)\n"
    "atexit.register(lambda: sys.stderr.write('THREAD-IMPORTS ' + ' '.join(imports) + '\\n'))\n"
    "sys.argv = ['llmchat', *sys.argv[1:]]\n"
    "runpy.run_module('llmchat', run_name='__main__')\n"
)


def test_no_thread_but_the_main_one_imports_during_a_one_shot(isolated_home, smollm2_path):
    """The model loads on its own thread while the main thread imports what the turn uses. The
    loading thread imports nothing: a Ctrl-C that leaves the main thread inside the import system
    can then never make a wait for that thread hang on an import lock, nor can the process exit
    while another thread is inside the import system (CPython 3.11 crashed there). Until then the
    turn's modules were imported on a thread of their own during the load."""
    ask = ("ask", "--no-history", "-m", str(smollm2_path), "-n", "4", "--temp", "0", "Hi")
    result = subprocess.run(
        [sys.executable, "-c", THREAD_IMPORTS, *ask],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("THREAD-IMPORTS")]
    assert line.split()[1:] == []


def test_a_chat_loads_on_the_load_thread_and_a_failure_after_it_frees_the_load(smollm2_path, load_threads, ledger):
    """Every start-up that loads a model (a chat's, batch's, `/model NAME`'s) runs llama.cpp's load
    on the loading thread while this one imports; when `Engine.load` fails instead of taking it,
    the load is stopped and freed, and no loading thread is left."""
    from llmchat.engine import Engine, EngineSettings
    from llmchat.errors import ModelError
    from llmchat.models.resolve import ResolvedModel
    from llmchat.startup import loading

    model = ResolvedModel(path=smollm2_path, name="smollm2", how="path", template=None, ctx=None)
    settings = EngineSettings(n_ctx=256, threads=1, flash_attn=False)
    engine = loading._load_with_spinner(model, settings)
    try:
        assert load_threads == [THREAD]
    finally:
        engine.close()
    ledger.assert_all_freed()

    def failing_load(path, settings):
        raise ModelError(f"llama.cpp could not load {path}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Engine, "load", failing_load)
        with pytest.raises(ModelError):
            loading._load_with_spinner(model, settings)
    assert load_threads == [THREAD, THREAD]
    assert _no_load_thread_left()
    made, freed = sum(ledger.made.values()), sum(ledger.freed.values())
    assert made == freed
