"""What the remote engines share: the shape of a streamed reply, and the type every one of them
satisfies.

`RemoteEngine` lets a server engine hold its peers (more servers of the same model,
llmchat.engine.remote.group) and lets batch spread work over them (llmchat.engine.remote.streams)
without naming either implementation, so neither engine module imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmchat.engine.interface import ChatEngine
from llmchat.engine.reply import GenerationOutcome

if TYPE_CHECKING:
    from llmchat.engine.remote.http import ServerClient
    from llmchat.engine.remote.spec import ServerSpec


@dataclass
class RemoteToken:
    """One streamed piece of the reply (the same shape as `llmchat.engine.core.TokenEvent`)."""

    text: str
    token_id: int


@dataclass
class RemoteOutcome(GenerationOutcome):
    """A `GenerationOutcome` plus the server slot that decoded it. (`server`, in the base class,
    holds what the server measured itself: `prompt_ms`, `prompt_n` (tokens it evaluated), `cache_n`
    (reused), `predicted_ms`, `predicted_n`, `predicted_per_second`.)"""

    slot: int | None = None


class RemoteEngine(ChatEngine, Protocol):
    """A `ChatEngine` served by another process: where it is, its connection, and its peers."""

    spec: ServerSpec
    client: ServerClient
    n_ctx: int  # settable: every prompt of a group must fit whichever server decodes it
    ctx_known: bool  # the server reports its context; otherwise it is assumed
    peers: list[RemoteEngine]
