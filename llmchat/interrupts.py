"""Ctrl-C and SIGTERM that are never lost, from the first line of llmchat's code to its exit.

Python runs a signal handler between bytecodes of the main thread. While llama.cpp loads a model
it calls back into Python thousands of times (the log callback, the load progress callback), so
that is where a signal's handler usually runs. An exception raised inside a ctypes callback cannot
leave it: ctypes reports it as "unraisable" and drops it. With Python's default handler a Ctrl-C
during the load vanished that way, and the command went on to answer in full and exit 0.

So llmchat's handler records the signal, and looks at where it runs. Outside a callback it also
raises at once, as Python's would (KeyboardInterrupt for SIGINT, SystemExit(143) for SIGTERM).
Inside one it only records it; the callbacks and the code around every native call act on the
record:
- the load progress callback returns false, which makes llama.cpp abort the load;
- `raise_pending()` raises the recorded signal's exception at the next safe point (after the
  load, at each decoded token, and before the process exits).
The same record catches the places where Python itself drops an exception: a `__del__` or a
weakref callback (`install()` also hooks `sys.unraisablehook`), and C code that runs Python and
clears whatever it raised, which reports nothing at all. A signal's exception stays recorded until
a checkpoint raises it or the code that caught it on purpose calls `consume()`.

Two places inside Python itself defer a signal the same way, because an exception raised there
does harm that outlives the code that catches it (`_inside_python_machinery`):
- importlib's own code (its module locks, its finders and loaders): raised between its taking of
  the global import lock and its `try`, the exception leaves the main thread holding that lock for
  good, and every other thread then waits forever at its next import;
- the top level of source text that exec() or eval() compiles (dataclasses build their methods
  so, namedtuple its `__new__`): a KeyboardInterrupt that leaves it, even one caught later, makes
  CPython 3.11 end the process by SIGINT after its teardown instead of with its exit code.
Imports and class definitions run briefly there, and a start-up's are followed by a checkpoint
(llmchat.launch), so such a signal is acted on a moment later.

Two more places defer a Ctrl-C the same way, because cutting them in the middle leaves things
wrong: a function marked `uninterrupted` (a terminal frame of cursor moves, written whole), and a
chat command that has begun to change state. Inside `Command()` a Ctrl-C cancels the command
(KeyboardInterrupt, as anywhere) until it calls a function marked `changes_state` (or `hold()`);
from then on the Ctrl-C is held, invisible to checkpoints, until the command is over, so it
finishes its change whole instead of leaving half of it (a conversation loaded under the old one's
id, a saved prompt's system prompt without its sampling). The chat then sees `interrupt_pending()`.

This module imports only the standard library: `llmchat.launch` installs it before anything else.
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the start-up path stays free of typing's import
    from types import CodeType, FrameType
    from typing import Any, Callable, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])

TERMINATED_EXIT = 143  # 128 + SIGTERM, as a shell reports a process ended by it

_callback_codes: set[CodeType] = set()
# The import system's own code, as CPython names its frozen modules in every version llmchat runs on,
# and as files where a build runs it unfrozen (`-X frozen_modules=off`, debug builds).
_IMPORTLIB_FILES = frozenset({"<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"})
_IMPORTLIB_PATHS = tuple(
    f"importlib{separator}{name}.py" for separator in ("/", "\\") for name in ("_bootstrap", "_bootstrap_external")
)
# llama-cpp-python installs its own log callback on import, before llmchat replaces it.
_CALLBACK_FILES = ("llama_cpp/_logger.py", "llama_cpp\\_logger.py")

# command: inside a Command(); holding: that command has begun to change state (a Ctrl-C is held).
# first_fired: inside FirstCtrlCOnly, whether its Ctrl-C came (None: outside one).
_state: dict[str, Any] = {
    "pending": None,
    "terminated": False,
    "installed": False,
    "command": False,
    "holding": False,
    "first_fired": None,
}


def native_callback(function: "F") -> "F":
    """Mark a function that C code calls through ctypes: a signal landing in it is deferred."""
    _callback_codes.add(function.__code__)
    return function


def uninterrupted(function: "F") -> "F":
    """Mark a function that must run whole (a frame of cursor moves on the terminal: cut halfway,
    the next frame erases rows that were never drawn): a signal landing in it is deferred to the
    next checkpoint, as in a native callback. Only for short work that cannot block for long."""
    _callback_codes.add(function.__code__)
    return function


def _holding(signum: int) -> bool:
    """A Ctrl-C is held while a command changes state (`Command`); a SIGTERM never is."""
    return signum == signal.SIGINT and bool(_state["holding"])


def _inside_callback(frame: FrameType | None) -> bool:
    while frame is not None:
        code = frame.f_code
        if code in _callback_codes or code.co_filename.endswith(_CALLBACK_FILES):
            return True
        frame = frame.f_back
    return False


def _in_importlib(code: CodeType) -> bool:
    return code.co_filename in _IMPORTLIB_FILES or code.co_filename.endswith(_IMPORTLIB_PATHS)


def _inside_python_machinery(frame: FrameType | None) -> bool:
    """Whether the signal's handler runs in importlib's own code, or in source text that exec() or
    eval() compiled, run from somewhere (see the module). Only the frames the signal landed in
    count, up to the first one of a real file: a signal in the code of a module being imported is
    raised as anywhere else, and so is one in code that merely runs under an exec() far down the
    stack (a test runner's worker). Not the top level of `python -c`, which has no caller."""
    while frame is not None and (frame.f_code.co_filename.startswith("<") or _in_importlib(frame.f_code)):
        code = frame.f_code
        if _in_importlib(code):
            return True
        if code.co_name == "<module>" and code.co_filename == "<string>" and frame.f_back is not None:
            return True
        frame = frame.f_back
    return False


def _deferred(signum: int, frame: FrameType | None) -> bool:
    """Whether a signal landing at `frame` is recorded only, to be raised at the next checkpoint."""
    return _holding(signum) or _inside_callback(frame) or _inside_python_machinery(frame)


def _exception_for(signum: int) -> BaseException:
    if signum == signal.SIGTERM:
        return SystemExit(TERMINATED_EXIT)
    return KeyboardInterrupt()


def _handle(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGTERM:
        # Only the first SIGTERM: a second one must not cut the cleanup short (SIGKILL still works).
        if _state["terminated"]:
            return
        _state["terminated"] = True
    if _state["pending"] is None or signum == signal.SIGTERM:
        _state["pending"] = signum
    if _deferred(signum, frame):
        return
    # Raised at once, and still recorded: CPython clears an exception in a few places of its own
    # (C code that runs Python and drops any error it raised), so a raise alone can vanish. The
    # next checkpoint raises it again, unless the code that caught it on purpose and goes on has
    # called `consume()`; nothing goes on after a SIGTERM.
    raise _exception_for(signum)


def install() -> None:
    """Route SIGINT and SIGTERM through `_handle` (idempotent; only the main thread may do it)."""
    if _state["installed"]:
        return
    try:
        signal.signal(signal.SIGINT, _handle)
        signal.signal(signal.SIGTERM, _handle)
    except ValueError:  # not the main thread (an embedding application): leave its handlers alone
        return
    _state["installed"] = True
    previous_hook = sys.unraisablehook

    def keep_signals(unraisable: Any) -> None:
        """Python drops an exception it cannot raise (one from a `__del__`, a weakref or ctypes
        callback, a generator closed by the garbage collector) after reporting it here. A signal's
        exception among them is kept as pending instead, to be raised at the next safe point."""
        signum = _signal_of(unraisable.exc_value)
        if signum is None:
            previous_hook(unraisable)
        elif _state["pending"] is None or signum == signal.SIGTERM:
            _state["pending"] = signum

    sys.unraisablehook = keep_signals


def _signal_of(error: BaseException | None) -> int | None:
    if isinstance(error, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(error, SystemExit) and error.code == TERMINATED_EXIT and _state["terminated"]:
        return signal.SIGTERM
    return None


def signal_behind(error: BaseException) -> int | None:
    """The signal (SIGINT, SIGTERM) whose exception Python wrapped in `error` on its way out, if
    any: Python 3.11 turns an exception raised while a class is created (a Ctrl-C landing in a
    `__set_name__` in the middle of an import) into "RuntimeError: Error calling __set_name__",
    caused by it. Found by tests/test_signals.py's sweep from the start."""
    seen = error.__cause__
    while seen is not None:
        signum = _signal_of(seen)
        if signum is not None:
            return signum
        seen = seen.__cause__
    return None


def pending() -> bool:
    """Whether a signal is recorded and not yet consumed (the load progress callback stops on it).
    A Ctrl-C held by a command that is changing state is not, until the command is over."""
    signum = _state["pending"]
    return signum is not None and not _holding(signum)


def interrupt_pending() -> bool:
    """Whether a Ctrl-C is recorded and not yet consumed (one a command held while it finished)."""
    return bool(_state["pending"] == signal.SIGINT)


def raise_pending() -> None:
    """Raise the exception of a recorded signal, if any: one that arrived inside a native callback,
    or whose first raise was dropped. Not a Ctrl-C held by a command that is changing state."""
    signum = _state["pending"]
    if signum is not None and not _holding(signum):
        raise _exception_for(signum)  # still recorded: this raise, too, could be dropped


def consume() -> None:
    """Say that a Ctrl-C's KeyboardInterrupt was caught on purpose (a turn ended by it, a prompt
    cleared), so that no checkpoint raises it again. A SIGTERM stays: the process ends by it."""
    if _state["pending"] == signal.SIGINT:
        _state["pending"] = None


def taken_by_a_question() -> None:
    """A Ctrl-C's KeyboardInterrupt that a question to the person caught (llmchat.edges.person: its
    "no"): consumed, and the turn's first Ctrl-C not spent (FirstCtrlCOnly), so that the next
    Ctrl-C still stops the turn, up to its last round."""
    consume()
    if _state["first_fired"]:
        _state["first_fired"] = False


def terminated() -> bool:
    """Whether a SIGTERM arrived (the exit is then 143 whatever unwinding raised)."""
    return bool(_state["terminated"])


def interrupt_handler(handler: Callable[[int, Any], None]) -> Callable[[int, Any], None]:
    """Wrap a SIGINT handler of the caller's own (chat's "first Ctrl-C only" rule) so that it, too,
    defers inside native callbacks instead of having its exception dropped."""

    def wrapped(signum: int, frame: FrameType | None) -> None:
        if _deferred(signum, frame):
            if _state["pending"] is None:
                _state["pending"] = signum
            return
        handler(signum, frame)

    return wrapped


def join_whole(thread: Any) -> None:
    """Wait until `thread` is done, even across a Ctrl-C or SIGTERM: its exception is raised once
    the thread is, so no thread of llmchat's is left running Python (or inside llama.cpp) while
    the interpreter exits, where CPython 3.11 crashes on a daemon thread that is still importing."""
    interrupted: BaseException | None = None
    while thread.is_alive():
        try:
            thread.join()
        except BaseException as error:  # noqa: BLE001 - raised below, once the thread is done
            interrupted = interrupted or error
    if interrupted is not None:
        raise interrupted


class FirstCtrlCOnly:
    """`with FirstCtrlCOnly():` around a turn of the chat. The first Ctrl-C raises
    KeyboardInterrupt (session.turn makes it an interrupted reply); later ones are ignored until
    the block ends, so hammering Ctrl-C cannot break the saving of the partial reply or leave the
    terminal's scrolling region set. A Ctrl-C that a question took is not the turn's
    (`taken_by_a_question`): the next one is the first again."""

    def __enter__(self) -> FirstCtrlCOnly:
        self._outer = _state["first_fired"]
        _state["first_fired"] = False
        try:
            self._previous_handler: Any = signal.signal(signal.SIGINT, interrupt_handler(_first_only))
        except ValueError:  # not the main thread: keep Python's default behaviour
            self._previous_handler = None
        return self

    def __exit__(self, *exc: object) -> None:
        _state["first_fired"] = self._outer
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)


def _first_only(signum: int, frame: FrameType | None) -> None:
    if _state["first_fired"] is False:
        _state["first_fired"] = True
        raise KeyboardInterrupt


class Command:
    """`with Command():` around one chat command. A Ctrl-C cancels it (KeyboardInterrupt) until it
    begins to change state (`hold()`, or a call of a `changes_state` function); from then on the
    Ctrl-C is held until the block ends, so the change is made whole (see the module)."""

    def __enter__(self) -> Command:
        self._outer = (_state["command"], _state["holding"])
        _state["command"], _state["holding"] = True, False
        try:  # the handler that knows holding (an embedding caller may not have installed it)
            self._previous_handler: Any = signal.signal(signal.SIGINT, _handle)
        except ValueError:  # not the main thread: its Ctrl-C is not ours to route
            self._previous_handler = None
        return self

    def __exit__(self, *exc: object) -> None:
        _state["command"], _state["holding"] = self._outer
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)


def hold() -> None:
    """Inside a `Command`: the change begins here (a Ctrl-C no longer cancels the command). Outside
    one it does nothing: a turn has its own Ctrl-C rules."""
    if _state["command"]:
        _state["holding"] = True


def changes_state(function: "F") -> "F":
    """Mark a method that changes what a chat command acts on (the session's conversation,
    settings, model; a history write): calling it inside a `Command` is `hold()`."""

    def changing(*args: Any, **kwargs: Any) -> Any:
        hold()
        return function(*args, **kwargs)

    changing.__name__, changing.__qualname__ = function.__name__, function.__qualname__
    changing.__doc__, changing.__wrapped__ = function.__doc__, function  # type: ignore[attr-defined]
    return changing  # type: ignore[return-value]
