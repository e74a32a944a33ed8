"""Several servers for one command (`--server` given more than once, or a configured group).

`batch` spreads its items over every server that answers (llmchat.engine.remote.streams); `ask` and
`chat` use the first that answers. The first engine that connected is the session's: it renders
and tokenizes every prompt, and the others (`peers`) decode them. So the servers must serve the
same model: for llama-server, whose prompts travel as token ids, the same tokenizer (checked on a
probe text); for OpenAI-compatible servers, which take messages, the same model name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from llmchat.errors import ServerError, UsageError

if TYPE_CHECKING:
    from llmchat.engine.remote.llama_server import LlamaServerEngine
    from llmchat.engine.remote.openai_compat import OpenAICompatEngine
    from llmchat.engine.remote.served import RemoteEngine
    from llmchat.engine.remote.spec import ServerSpec

# Text whose tokens tell two tokenizers apart: words, digits, punctuation, non-ASCII and a control token.
_PROBE = "Hello, world! 1234567 — naïve café, 日本語 <|im_start|>user\n\tdef f(x): return x**2"


class ServersGone(ServerError):
    """Every server of a batch stopped answering; the items not finished were not written."""


def short_reason(err: Exception, url: str = "") -> str:
    """The first clause of a one-line message: what went wrong, without what to do, and without
    `url` (the caller names the server once, before it)."""
    reason = str(err).split("; ")[0]
    if url:
        for form in (f" to {url}", f" with {url}", f"{url}: ", f"{url} "):
            reason = reason.replace(form, "")
    return reason


def connect_servers(
    specs: Sequence[ServerSpec],
    *,
    every: bool,
    connect: Callable[[ServerSpec], RemoteEngine],
    say: Callable[[str], None],
) -> RemoteEngine:
    """Connect to the first server that answers (`every`: to every one that answers) and return the
    first engine, with the others as its `peers`. A server that does not answer is skipped with
    one notice; when none answers, a ServerError (exit 6) names each."""
    engines: list[RemoteEngine] = []
    failed: list[tuple[ServerSpec, ServerError]] = []
    try:
        for spec in specs:
            try:
                engines.append(connect(spec))
            except ServerError as err:
                if len(specs) == 1:
                    raise
                failed.append((spec, err))
                continue
            if not every:
                break
        if not engines:
            reasons = ", ".join(f"{spec.shown_url} ({short_reason(err, spec.shown_url)})" for spec, err in failed)
            raise ServerError(
                f"none of the {len(specs)} servers answered: {reasons}; check that they are running and the URLs "
                "in --server"
            )
        primary, peers = engines[0], engines[1:]
        for peer in peers:
            check_same_model(primary, peer)
        n_ctx = min(engine.n_ctx for engine in engines)
        for engine in engines:
            engine.n_ctx = n_ctx  # every prompt must fit whichever server decodes it
        primary.peers = peers
    except BaseException:
        for engine in engines:
            engine.close()
        raise
    if failed:
        missing = ", ".join(f"{spec.shown_url} ({short_reason(err, spec.shown_url)})" for spec, err in failed)
        if every:
            say(f"server: no answer from {missing}; going on with the other {len(engines)}")
        else:
            say(f"server: no answer from {missing}; using {primary.spec.shown_url}")
    return primary


def check_same_model(primary: RemoteEngine, other: RemoteEngine) -> None:
    """A usage error unless `other` can decode what `primary` renders and tokenizes."""
    first, second = primary.spec.shown_url, other.spec.shown_url
    # llama-server takes prompts as token ids; an OpenAI-compatible server takes messages.
    if primary.caps.token_ids != other.caps.token_ids:
        raise UsageError(
            f"--server {first} and {second} are different kinds of server (llama-server and OpenAI-compatible); "
            "give servers of one kind, serving the same model"
        )
    if primary.caps.token_ids:
        one, two = cast("LlamaServerEngine", primary), cast("LlamaServerEngine", other)
        same = one.add_bos == two.add_bos and one.bos_id == two.bos_id
        if not same or one.tokenize(_PROBE, special=True) != two.tokenize(_PROBE, special=True):
            raise UsageError(
                f"--server {second} serves another model than {first} (its tokenizer differs); "
                "give servers that serve the same model"
            )
        return
    one_name, two_name = cast("OpenAICompatEngine", primary).model, cast("OpenAICompatEngine", other).model
    if one_name != two_name:
        raise UsageError(
            f"--server {second} serves {two_name!r}, not {one_name!r} as {first} does; name one model with -m"
        )
