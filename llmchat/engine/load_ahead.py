"""A model load begun ahead of `Engine.load`, on a thread of its own.

A one-shot `ask` knows which model it will open long before it opens it: after the options are
parsed, the rest of its start-up is Python (the option checks, the modules the turn uses, MCP
servers, reading stdin), and llama.cpp's load of the model and its context waited for all of it.
llama.cpp loads in C with the GIL released, so on a second core the two can run side by side:
`begin` starts `open_model` on another thread with the arguments `Engine.load` will give it, and
`Engine.load` takes the result when its own arguments are the same (`take`).

This module owns the one load in flight. Whoever begins one makes sure it ends: `take` hands the
model over, `cancel` stops the load at its next progress callback (engine.model_load.loads_stopped)
and frees whatever it made. The process never exits with the thread inside llama.cpp, where a
teardown of the interpreter would meet it in one of its Python callbacks.

The thread imports nothing once it has started: every module its code uses is imported here, by
the thread that begins it (tests/test_load_ahead.py checks it on a real run). So a wait for it
never waits on the import system's locks, whatever the main thread was doing when a Ctrl-C came.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from llmchat import interrupts
from llmchat.engine import logs
from llmchat.engine.model_load import EngineSettings, loads_stopped, open_arguments, open_model
from llmchat.engine.native import LoadedModel, ensure_backend
from llmchat.engine.threads import CpuReading


class _Load:
    """`open_model(path, **arguments)` on its own thread; its model, or None if it failed."""

    def __init__(self, path: Path, arguments: dict[str, Any], cpu_before: CpuReading):
        self.path = path
        self.arguments = arguments
        self.cpu_before = cpu_before
        self.model: LoadedModel | None = None
        # Not a daemon: should a Ctrl-C land between the start and the moment this load is known
        # (`begin`), Python's own exit still waits for the thread before it tears the process
        # down, never with the thread inside llama.cpp (whose static tables the exit frees).
        self._thread = threading.Thread(target=self._run, name="llmchat-load-ahead")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self.model = open_model(self.path, **self.arguments)
        except BaseException:  # noqa: BLE001 - `Engine.load` opens it again and says why it fails
            self.model = None

    def wait(self) -> None:
        """Until the thread is done. A signal while waiting (a Ctrl-C) is raised once it is: the
        load stops at its next callback, since `interrupts.pending()` stops every load."""
        interrupts.join_whole(self._thread)


_state: dict[str, _Load | None] = {"load": None}


def begin(path: Path, settings: EngineSettings) -> None:
    """Start opening the model at `path` as `Engine.load` would under `settings` (no drafting);
    nothing new where this very load is in flight already (a one-shot `ask` began it early)."""
    arguments = open_arguments(settings)
    load = _state["load"]
    if load is not None and load.path == path and load.arguments == arguments:
        return
    cancel()  # one load in flight at most
    # The machine's CPU use as the load begins: `Engine.load` chooses the thread count from what
    # other processes kept busy over the load (engine.threads), and this is where it begins.
    cpu_before = CpuReading.now()
    logs.install(settings.verbose)  # before llama.cpp says anything: its log never reaches stdout
    ensure_backend()  # here, once, rather than on the new thread beside anything else
    load = _Load(path, arguments, cpu_before)
    _state["load"] = load  # known before it starts: whatever interrupts `begin`, `cancel` finds it
    load.start()


def take(path: Path, arguments: dict[str, Any]) -> tuple[LoadedModel, CpuReading] | None:
    """The model begun ahead, when it is `path` opened with these very `arguments`: it is the
    caller's from now on; with the CPU reading taken as its load began. None when there is none,
    it failed (the caller opens the file itself and meets the error), or it is another (then
    cancelled)."""
    load = _state["load"]
    if load is None:
        return None
    if load.path != path or load.arguments != arguments:
        cancel()
        return None
    load.wait()  # interrupted: the load stays in flight, for the caller's cleanup to cancel
    _state["load"] = None
    return None if load.model is None else (load.model, load.cpu_before)


def cancel() -> None:
    """Stop the load in flight, if any, and free what it made."""
    load = _state["load"]
    if load is None:
        return
    try:
        with loads_stopped():
            load.wait()  # raises only once the thread is done
    finally:
        _state["load"] = None
        if load.model is not None:
            load.model.close()
