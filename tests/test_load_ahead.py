"""A one-shot `ask` begins llama.cpp's load on a thread of its own while its start-up goes on
(llmchat.engine.load_ahead): the model is opened once, there; a start-up that stops before the
load is taken (a bad option) cancels it and frees everything it made; a load asked with other
settings than the one begun opens its own and frees the other.

Real loads of the bundled model, counted through the ledger of tests/test_engine_cleanup.py.
"""

from __future__ import annotations

import io
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


def test_a_load_that_fails_at_once_leaves_no_thread_running_python(monkeypatch):
    """While the model loads, another thread imports the turn's modules and compiles a template
    (`loading._prepare_while_loading`). A load that failed at once used to return while that
    thread was still importing; the command then exited, and CPython 3.11 crashed (SIGSEGV in the
    import lock during finalization) in about a third of the runs on a busy machine. The failed
    load now returns only once that thread is done."""
    from pathlib import Path
    from types import SimpleNamespace

    from llmchat import loading
    from llmchat.engine import Engine
    from llmchat.errors import ModelError
    from llmchat.prompt import sandbox

    load_failed = threading.Event()
    prepared: list[str] = []

    def slow_warm_up(source, label):
        load_failed.wait(timeout=60)  # still compiling when the load fails
        prepared.append(label)

    def failing_load(path, settings):
        load_failed.set()
        raise ModelError(f"llama.cpp could not load {path}")

    monkeypatch.setattr(sandbox, "compile_template", slow_warm_up)
    monkeypatch.setattr(Engine, "load", failing_load)
    with pytest.raises(ModelError):
        loading._load_with_spinner(SimpleNamespace(path=Path("broken.gguf")), SimpleNamespace())
    assert prepared == ["warm-up"], "the warm-up thread finished before the failure went on"
    assert not [t for t in threading.enumerate() if t.name == "llmchat-prepare"]
