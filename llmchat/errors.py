"""Error types and exit codes. No I/O here: the CLI turns these into one line on stderr."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1  # anything else: I/O failure, a batch with failed items
    USAGE = 2  # bad flag, bad value, empty prompt
    MODEL = 3  # model missing, unreadable, corrupt or refused (hostile template)
    CONTEXT = 4  # the prompt cannot fit the context window
    OUTPUT = 5  # structured output (--schema, --format json) invalid: cut off, or not matching the schema
    SERVER = 6  # a remote server (--server) unreachable, refusing, failing or cutting the stream
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    TERMINATED = 143  # SIGTERM (128 + SIGTERM)


class LlmchatError(Exception):
    """An error the user can act on. `str(err)` is the whole message: what went wrong and what to do."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, *, exit_code: ExitCode | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(LlmchatError):
    exit_code = ExitCode.USAGE


class ModelError(LlmchatError):
    exit_code = ExitCode.MODEL


class TemplateError(LlmchatError):
    """A chat template that cannot be used: unknown name, parse error, raised, or refused by the sandbox."""

    exit_code = ExitCode.MODEL


class ContextOverflowError(LlmchatError):
    exit_code = ExitCode.CONTEXT

    def __init__(self, message: str, *, prompt_tokens: int = 0, limit: int = 0):
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class HistoryError(LlmchatError):
    """The history database cannot be used (corrupt, locked too long, unwritable)."""

    exit_code = ExitCode.ERROR


class ConfigError(LlmchatError):
    exit_code = ExitCode.USAGE


class ServerError(LlmchatError):
    """A remote server failed the request. `retriable`: busy (429, 503) or a dropped connection,
    worth another try after a pause (batch does); `status`: the HTTP status when there was one."""

    exit_code = ExitCode.SERVER

    def __init__(self, message: str, *, retriable: bool = False, status: int | None = None):
        super().__init__(message)
        self.retriable = retriable
        self.status = status
