"""Media attachments meeting the model: said before the model loads where the files already tell
(an image for a model without a projector), and handed to the engine when the turn counts them."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, cast

from llmchat.errors import UsageError

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.engine.core import Engine
    from llmchat.engine.interface import ChatEngine
    from llmchat.engine.media.parts import TakesRemoteMedia
    from llmchat.engine.remote.served import RemoteEngine
    from llmchat.options import RunOptions
    from llmchat.store.attachment_records import Attachment


def _what(attachment: Attachment) -> str:
    return "an image" if attachment.media == "image" else "audio"


def media_tokens(engine: ChatEngine, attachment: Attachment) -> int:
    """The positions an image or audio clip takes in the prompt. The engine is given it here, so
    that its marker becomes its tokens; UsageError where the engine takes no media or cannot
    decode this file."""
    if not engine.caps.media:
        if engine.caps.remote:  # a llama-server whose GET /props lists no modalities
            raise UsageError(
                f"{attachment.path} is {_what(attachment)}, but {cast('RemoteEngine', engine).spec.shown_url} has "
                "no multimodal projector; start llama-server with --mmproj FILE (its model's mmproj*.gguf)"
            )
        raise UsageError(
            f"{attachment.path} is {_what(attachment)}, but the model has no multimodal projector; "
            "pass --mmproj FILE, or keep its mmproj*.gguf beside the model"
        )
    return _add(engine, attachment.data, attachment.path, attachment.media)


def _add(engine: ChatEngine, data: bytes, name: str, kind: str) -> int:
    """Give the engine the media: a local one evaluates it through libmtmd, a server's engine sends
    it as a content part (llmchat.engine.media.parts) or with the prompt's text
    (llmchat.engine.media.server)."""
    if engine.caps.remote:
        from llmchat.media.kinds import sniff

        found = sniff(data)
        return cast("TakesRemoteMedia", engine).add_media(data, kind, found.format if found else "")
    from llmchat.engine.media.local import add_media

    return add_media(cast("Engine", engine), data, name, kind).media_tokens


def _holds(engine: ChatEngine, sha256: str) -> bool:
    if engine.caps.remote:
        return sha256 in cast("TakesRemoteMedia", engine).media.items
    from llmchat.engine.media.local import holds_media

    return holds_media(cast("Engine", engine), sha256)


def check_before_loading(opts: RunOptions, config: Config, attachments: Sequence[Attachment]) -> None:
    """UsageError, before the model loads, when media are attached and the model has no projector
    (--mmproj, or an mmproj*.gguf beside it) or is a server's. Other problems are left to the load."""
    media = [attachment for attachment in attachments if attachment.media]
    if not media:
        return
    if opts.server:
        return  # the server's engine says, once connected (media_tokens), and the server whether its model takes them
    from llmchat.errors import LlmchatError
    from llmchat.gguf.header_cache import read_metadata_cached
    from llmchat.media.projector import find_projector
    from llmchat.models.resolve import resolve_model

    try:
        model = resolve_model(opts.model, config)
        metadata = read_metadata_cached(model.path)
    except LlmchatError:
        return  # the load says what is wrong with the model, in its own words
    found = find_projector(opts.mmproj, model.path, metadata)
    if found is None:
        raise UsageError(
            f"{media[0].path} is {_what(media[0])}, but {model.path.name} has no multimodal projector; "
            "pass --mmproj FILE, or keep its mmproj*.gguf beside the model"
        )
    odd = next((a for a in media if not (found.vision if a.media == "image" else found.audio)), None)
    if odd is not None:  # audio for a projector that sees only, or an image for one that hears only
        takes, other = ("images only", "an image") if found.vision else ("audio only", "audio")
        raise UsageError(f"{odd.path} is {_what(odd)}, but {found.path.name} takes {takes}; attach {other}")


def give_media(
    engine: ChatEngine, attachments: Sequence[Attachment], messages: Sequence[dict[str, Any]], kept: Path | None
) -> None:
    """Hand the engine every image and audio clip of the conversation and of the new message
    before its prompt is rendered: after /model, /retry, /edit, /branch or a resumed conversation,
    the engine that renders it may not have been given them (a no-op for media it holds). An
    earlier message's media come with it in memory, or from the history's media folder `kept`
    (llmchat.store.media_files), by the hash its marker names; those this engine cannot take stay
    their markers' text. The new message's are refused with one line."""
    if engine.caps.media:
        earlier = [a for message in messages for a in (message.get("attachments") or ()) if a.media and a.data]
        for attachment in earlier:
            with contextlib.suppress(UsageError):  # one this projector cannot take stays its marker's text
                media_tokens(engine, attachment)
        for attachment in attachments:
            if attachment.media:
                media_tokens(engine, attachment)
        if kept is not None:
            _from_the_history(engine, messages, kept, {a.sha256 for a in earlier})
    elif any(attachment.media for attachment in attachments):
        media_tokens(engine, next(a for a in attachments if a.media))  # the one-line refusal


def _from_the_history(engine: ChatEngine, messages: Sequence[dict[str, Any]], kept: Path, given: set[str]) -> None:
    from llmchat.engine.media.marks import MARKER
    from llmchat.media.kinds import sniff
    from llmchat.store.media_files import attached_file

    for message in messages:
        content = message.get("content")
        for found in MARKER.finditer(content if isinstance(content, str) else ""):
            sha = found.group(1)
            if sha in given or _holds(engine, sha):
                continue
            given.add(sha)
            try:
                data = attached_file(kept, sha).read_bytes()
            except OSError:
                continue  # not kept (saved without it, or removed): the marker stays text
            kind = sniff(data)
            if kind is not None and hashlib.sha256(data).hexdigest() == sha:
                with contextlib.suppress(UsageError):
                    _add(engine, data, f"the {kind.kind} {sha[:12]}", kind.kind)
