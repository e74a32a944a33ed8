"""Images and audio on llmchat's token-id path to llama-server (llmchat.engine.remote.llama_server).

`POST /completion` takes media only beside text, never beside token ids: `{"prompt_string": TEXT,
"multimodal_data": [BASE64, ...]}`, where the server's media marker (`media_marker` in GET /props:
random per server process in newer builds, `<__media__>` in older ones) stands for each file, in
order. libmtmd cuts the text at the markers and tokenizes each part with special tokens parsed,
with BOS in front where the model adds one (`process_mtmd_prompt`: add_special and parse_special
are both on). So a prompt that holds media the engine was given goes as its rendered text:
- the trust rule (llmchat.engine.prompt_pieces) cannot cut that text into pieces tokenized apart:
  an untrusted piece (a message, a file, a tool's output) that would read as a control token is
  refused in one line instead of changing what the prompt says;
- the template's own BOS text comes off the front where the server adds BOS itself (one BOS);
- the ids llmchat counts and compares are each text part tokenized as libmtmd does and each media's
  positions as sentinels (llmchat.engine.media.marks): `ESTIMATE` of them until a reply says how many
  the server's projector made. `generate` gets those ids, so the text is kept by them (`prompts`);
- the server matches cached media by content, but llmchat cannot know where its cache and these ids
  part, so it claims no reuse: the reply's `timings` say what the server reused.

The texts kept are bounded: the latest `_PROMPTS_KEPT`, and no more than `_TEXT_KEPT` characters
(a batch's prompts in flight, a chat's few latest). They are found by a digest of their ids, and a
prompt continued (a tool round, a reply carried on) by the digests of its prefixes at the kept
lengths, taken in one pass over its ids: no kept prompt is compared id by id.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from llmchat.engine.media.marks import MARKER, count_media, is_media, sentinels
from llmchat.engine.media.parts import ESTIMATE, RemoteMedia
from llmchat.errors import UsageError

if TYPE_CHECKING:
    from llmchat.engine.prompt_pieces import PromptPiece
    from llmchat.engine.remote.served import RemoteOutcome
    from llmchat.engine.remote.spec import ServerSpec

# Media prompts kept by their ids: a batch's prompts in flight, and a chat's few latest.
_PROMPTS_KEPT = 256
_TEXT_KEPT = 64 * 1024 * 1024  # characters of their texts, all together: a few whole contexts' worth


def _digest(ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()


class ServerMedia(RemoteMedia):
    """The media a llama-server engine was given, how many positions the server made of each, and
    the text of each media prompt built, by its ids. Its peers decode with it too (batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}  # positions by SHA-256, once a reply said
        # digest of a prompt's ids -> (how many ids, its text); least recently kept first
        self._prompts: OrderedDict[bytes, tuple[int, str]] = OrderedDict()
        self._lengths: Counter[int] = Counter()  # how many prompts of each length are kept
        self._chars = 0

    def add(self, data: bytes, kind: str, format: str) -> int:
        estimate = super().add(data, kind, format)
        return self.counts.get(hashlib.sha256(data).hexdigest(), estimate)

    def positions(self, sha256: str) -> int:
        return self.counts.get(sha256) or ESTIMATE.get(self.items[sha256].kind, ESTIMATE["image"])

    def keep(self, ids: list[int], text: str) -> None:
        key = _digest(ids)
        if key in self._prompts:
            self._forget(key)
        self._prompts[key] = (len(ids), text)
        self._lengths[len(ids)] += 1
        self._chars += len(text)
        while len(self._prompts) > _PROMPTS_KEPT or (self._chars > _TEXT_KEPT and len(self._prompts) > 1):
            self._forget(next(iter(self._prompts)))

    def _forget(self, key: bytes) -> None:
        length, text = self._prompts.pop(key)
        self._lengths[length] -= 1
        if not self._lengths[length]:
            del self._lengths[length]
        self._chars -= len(text)

    def kept(self) -> int:
        """How many prompts' texts are kept."""
        return len(self._prompts)

    def text_of(self, ids: Sequence[int]) -> str | None:
        """The text of the kept prompt of exactly these ids."""
        found = self._prompts.get(_digest(ids))
        return None if found is None else found[1]

    def text_for(self, ids: list[int]) -> tuple[str, list[int]] | None:
        """The text of the longest kept prompt that `ids` start with, and the ids after it (a reply
        continued, a tool round after the first); None when none."""
        best: tuple[int, str] | None = None
        digest = hashlib.blake2b(digest_size=16)
        at = 0
        for length in sorted(n for n in self._lengths if n <= len(ids)):
            digest.update(array("q", ids[at:length]).tobytes())
            at = length
            found = self._prompts.get(digest.copy().digest())
            if found is not None:
                best = found
        return None if best is None else (best[1], ids[best[0] :])


class MediaFacts(Protocol):
    """What the server said of its projector (llama_server.ServerFacts, from GET /props)."""

    @property
    def vision(self) -> bool: ...
    @property
    def audio(self) -> bool: ...
    @property
    def media_marker(self) -> str: ...


class ServerEngine(Protocol):
    """What of llama_server.LlamaServerEngine its media prompts use (a protocol: that module
    imports this one)."""

    bos_id: int
    add_bos: bool
    bos_text: str

    @property
    def facts(self) -> MediaFacts: ...
    @property
    def spec(self) -> ServerSpec: ...
    @property
    def media(self) -> ServerMedia: ...
    def tokenize(self, text: str, *, special: bool) -> list[int]: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...
    def is_control(self, token_id: int) -> bool: ...


def holds_media(media: ServerMedia, pieces: Sequence[PromptPiece]) -> bool:
    """Whether the rendered prompt has a marker of media the engine was given."""
    return bool(media.items) and any(
        found.group(1) in media.items for piece in pieces for found in MARKER.finditer(piece[0])
    )


def takes(engine: ServerEngine, kind: str) -> None:
    """UsageError unless the server's projector takes this kind of media."""
    facts, url = engine.facts, engine.spec.shown_url
    if facts.vision if kind == "image" else facts.audio:
        return
    what = "an image" if kind == "image" else "audio"
    if not (facts.vision or facts.audio):
        raise UsageError(f"{what} for {url}, which has no multimodal projector; start llama-server with --mmproj FILE")
    only, other = ("audio only", "audio") if kind == "image" else ("images only", "an image")
    raise UsageError(
        f"{what} for {url}, whose projector (--mmproj) takes {only}; attach {other}, "
        f"or start llama-server with a projector for {'images' if kind == 'image' else 'audio'}"
    )


def media_prompt(engine: ServerEngine, pieces: Sequence[PromptPiece]) -> list[int]:
    """The ids of a rendered prompt that holds media, its text kept for `completion_prompt`."""
    _refuse_control_text(engine, pieces)
    text = "".join(piece[0] for piece in pieces)
    marker = engine.facts.media_marker
    if marker in text:
        raise UsageError(f"the prompt holds {marker!r}, {engine.spec.shown_url}'s own media marker, as text; remove it")
    ids: list[int] = []
    for part, sha in _split(text, engine.media):
        ids += sentinels(sha, engine.media.positions(sha)) if sha else engine.tokenize(part, special=True)
    if engine.add_bos and engine.bos_id >= 0:
        bos = engine.bos_text
        if ids[:1] == [engine.bos_id] and bos and text.startswith(bos):
            text = text[len(bos) :]  # the template wrote BOS; libmtmd puts the server's own in front
        else:
            ids.insert(0, engine.bos_id)
    engine.media.keep(ids, text)
    return ids


def completion_prompt(engine: ServerEngine, ids: list[int]) -> list[int] | dict[str, Any]:
    """/completion's `prompt` for these ids: the ids themselves, or, where they hold media, the
    kept text with the server's marker for each media and the files in the same order."""
    if not any(is_media(token) for token in ids):
        return ids
    found = engine.media.text_for(ids)
    if found is None:
        raise UsageError(f"a prompt with images or audio that was not built for {engine.spec.shown_url}; try again")
    text, rest = found
    if rest:
        text += _continuation(engine, rest)
    files: list[str] = []
    wire: list[str] = []
    for part, sha in _split(text, engine.media):
        if sha:
            item = engine.media.items[sha]
            takes(engine, item.kind)  # a peer of a batch may have another projector, or none
            files.append(item.encoded())
        wire.append(engine.facts.media_marker if sha else part)
    # errors="replace": a lone surrogate cannot go out as JSON text (as in ServerEngine.tokenize).
    text = "".join(wire).encode("utf-8", errors="replace").decode("utf-8")
    return {"prompt_string": text, "multimodal_data": files}


def server_counts(
    engine: ServerEngine, prompt: list[int], sent: list[int], timings: dict[str, Any], outcome: RemoteOutcome
) -> None:
    """A media prompt's prompt and image/audio tokens as the server counted them (`prompt_n` +
    `cache_n` of the request that sent `sent`, the prompt and any reply continued); the positions
    of a prompt's only media are kept for its later prompts."""
    estimated = count_media(sent)
    total = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
    if not estimated or total <= 0:
        return
    positions = max(total - (len(sent) - estimated), 0)
    outcome.media_tokens = positions
    outcome.prompt_tokens = len(prompt) - count_media(prompt) + positions
    shas = [sha for _, sha in _split(engine.media.text_of(prompt) or "", engine.media) if sha]
    if shas and len(set(shas)) == 1 and positions % len(shas) == 0:
        engine.media.counts[shas[0]] = positions // len(shas)


def _split(text: str, media: ServerMedia) -> Iterator[tuple[str, str]]:
    """(text, "") for each text part and (marker, its SHA-256) for each marker of given media."""
    at = 0
    for found in MARKER.finditer(text):
        if found.group(1) not in media.items:
            continue  # not media the engine was given: plain text, as on the local engine
        if found.start() > at:
            yield text[at : found.start()], ""
        yield found.group(0), found.group(1)
        at = found.end()
    if at < len(text):
        yield text[at:], ""


def _refuse_control_text(engine: ServerEngine, pieces: Sequence[PromptPiece]) -> None:
    """UsageError where an untrusted piece would tokenize differently with special tokens parsed:
    the server parses them in all of a media prompt's text."""
    for piece in pieces:
        if piece[1]:
            continue
        parsed, plain = engine.tokenize(piece[0], special=True), engine.tokenize(piece[0], special=False)
        if parsed != plain:
            control = next((token for token in parsed if token not in set(plain)), parsed[0])
            raise UsageError(
                f"a message holds {engine.detokenize([control])!r}, which {engine.spec.shown_url} would read as "
                "a control token in a prompt with images or audio (it tokenizes those itself); remove it from "
                "the message, or leave the media out"
            )


def _continuation(engine: ServerEngine, rest: list[int]) -> str:
    """The text of ids that continue a kept media prompt (a reply so far, a tool round's calls and
    results). UsageError where it would gain control tokens the ids lack (a tool's output that
    spells one) once the server parses it."""
    if any(is_media(token) for token in rest):
        raise UsageError(f"a prompt with images or audio that was not built for {engine.spec.shown_url}; try again")
    text = engine.detokenize(rest)
    parsed, plain = engine.tokenize(text, special=True), set(engine.tokenize(text, special=False))
    controls = {token for token in set(parsed) - plain if engine.is_control(token)}
    if sorted(t for t in parsed if t in controls) != sorted(t for t in rest if t in controls):
        raise UsageError(
            f"a tool's output or the reply holds text that {engine.spec.shown_url} would read as a control token "
            "in a prompt with images or audio (it tokenizes those itself); leave the media out of this conversation"
        )
    return text
