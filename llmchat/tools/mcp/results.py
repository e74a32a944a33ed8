"""What an MCP server returns, as text for the model (and files for the person).

Every content kind of a tool result, a read resource or a prompt message becomes text:
- text: as it is;
- an image or audio clip: saved under the media folder the connection was given (the cache's
  `paths.mcp_media_dir()`, or a temporary folder where the conversation is not saved), named by
  its content's hash, so the same image is one file; the model gets a placeholder naming the file
  and its MIME type, and the person a notice with the path. The file is private (0600 in a 0700
  folder): it is part of a conversation, and the placeholder in that conversation's text is what
  ties the two (llmchat.store.media_files removes it with the last conversation naming it);
- an embedded resource: its URI and MIME type, then its text (a blob is saved like an image);
- a resource link: its URI, name, MIME type and description (the model can ask for it to be read;
  the person attaches it with `-f mcp:SERVER/URI`);
- `structuredContent`: checked against the tool's `outputSchema`, then passed as JSON text, unless
  a text block already repeats it (its JSON, or the one value of a wrapped result: FastMCP sends
  `"done"` with {"result": "done"}), when the text blocks are what the model gets;
- `isError`: a ToolFailure, so the model gets the `Error: ...` text every failed tool gives.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import mimetypes
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmchat.private_files import own_private_dir, write_private_atomic
from llmchat.tools.spec import ToolFailure

Notify = Callable[[str], None]


@dataclass(frozen=True)
class SavedMedia:
    """A binary block written to the cache: where, what kind, how big."""

    path: Path
    mime_type: str
    size: int

    def placeholder(self, what: str) -> str:
        return f"[{what} {self.mime_type}, {self.size} bytes, saved to {self.path}]"


@dataclass(frozen=True)
class BlockText:
    """One content block as text, and the file it was saved to (binary blocks only)."""

    kind: str  # text | image | audio | resource | resource_link | ...
    text: str
    saved: SavedMedia | None = None


def media_folder(saved_conversation: bool) -> Path:
    """Where the media of a run's MCP servers go: the cache's folder where the conversation is
    saved, else this process's temporary folder (removed at exit): an unsaved chat leaves no file."""
    if saved_conversation:
        from llmchat.paths import mcp_media_dir

        return mcp_media_dir()
    from llmchat.private_files import temporary_dir

    return temporary_dir() / "mcp"


def decoded(data_b64: str, mime_type: str) -> bytes:
    """The bytes of a base64 block the server sent; ToolFailure when it is not base64."""
    try:
        return base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ToolFailure(f"the server sent {mime_type} data that is not valid base64") from None


def save_media(data_b64: str, mime_type: str, media_dir: Path, stem: str) -> SavedMedia:
    """Decode base64 data and keep it under media_dir, named `STEM-HASH.EXT`, 0600 in a 0700 folder
    (a folder an earlier version left 0755 is made 0700)."""
    data = decoded(data_b64, mime_type)
    digest = hashlib.sha256(data).hexdigest()[:16]
    extension = mimetypes.guess_extension(mime_type.split(";")[0].strip()) or ".bin"
    safe_stem = re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:60] or "mcp"
    own_private_dir(media_dir)
    path = media_dir / f"{safe_stem}-{digest}{extension}"
    if not path.exists():
        # Whole or absent (a temp file renamed): a crash never leaves half a picture under the final name.
        write_private_atomic(path, data)
    return SavedMedia(path, mime_type, len(data))


def block_text(block: Any, media_dir: Path, stem: str) -> BlockText:
    """Text for one content block (a tool result's, a prompt message's)."""
    kind = str(getattr(block, "type", "content"))
    if kind == "text":
        return BlockText(kind, str(block.text))
    if kind in ("image", "audio"):
        saved = save_media(block.data, block.mime_type, media_dir, stem)
        return BlockText(kind, saved.placeholder(kind), saved)
    if kind == "resource":
        return resource_contents_text(block.resource, media_dir, stem, embedded=True)
    if kind == "resource_link":
        return BlockText(kind, _link_text(block))
    return BlockText(kind, f"[{kind} content, which llmchat does not show]")


def resource_contents_text(contents: Any, media_dir: Path, stem: str, *, embedded: bool = False) -> BlockText:
    """A resource's contents (text, or a blob saved to the cache), headed by its URI."""
    uri = str(contents.uri)
    mime = contents.mime_type or "text/plain"
    kind = "resource"
    text = getattr(contents, "text", None)
    if isinstance(text, str):
        head = f"[resource {uri} ({mime})]" if embedded else ""
        return BlockText(kind, f"{head}\n{text}" if head else text)
    saved = save_media(str(contents.blob), contents.mime_type or "application/octet-stream", media_dir, stem)
    return BlockText(kind, f"[resource {uri}: {mime}, {saved.size} bytes, saved to {saved.path}]", saved)


def _link_text(link: Any) -> str:
    details = [str(link.name)] if getattr(link, "name", None) else []
    if getattr(link, "mime_type", None):
        details.append(str(link.mime_type))
    line = f"[resource link {link.uri}" + (f" ({', '.join(details)})" if details else "") + "]"
    description = getattr(link, "description", None)
    return f"{line} {description}" if description else line


def structured_text(tool: str, structured: Any, output_schema: dict[str, Any] | None) -> str:
    """structuredContent as JSON text, after checking it against the tool's outputSchema."""
    if output_schema:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError, UnknownType
        from jsonschema.validators import validator_for

        try:
            dialect = validator_for(output_schema, default=Draft202012Validator)  # its own $schema, else 2020-12
            dialect.check_schema(output_schema)
            problems = sorted(dialect(output_schema).iter_errors(structured), key=lambda e: list(e.absolute_path))
        except (SchemaError, UnknownType) as err:
            reason = err.message if isinstance(err, SchemaError) else f"unknown type {err.type!r}"
            raise ToolFailure(f"the tool {tool} declares an output schema that is not valid: {reason}") from None
        if problems:
            where = "/".join(str(part) for part in problems[0].absolute_path)
            raise ToolFailure(
                f"the tool {tool} returned structured content that does not match its output schema"
                + (f" at {where}" if where else "")
                + f": {problems[0].message}"
            )
    return json.dumps(structured, ensure_ascii=False)


def _repeats(text: str, structured: Any) -> bool:
    """Whether a text block only repeats the structured content: its JSON (servers SHOULD send it),
    or the one value a wrapped result holds (FastMCP returns `"done"` as {"result": "done"})."""
    if isinstance(structured, dict) and len(structured) == 1:
        (value,) = structured.values()
        if text == (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)):
            return True
    try:
        return bool(json.loads(text) == structured)
    except (json.JSONDecodeError, ValueError):
        return False


@dataclass(frozen=True)
class HandledResult:
    """A tool result handled: the text the model gets, and what each block was."""

    tool: str
    text: str
    blocks: tuple[BlockText, ...]
    annotations: tuple[dict[str, Any] | None, ...]
    structured: Any
    is_error: bool

    def text_for_model(self) -> str:
        """The text, or ToolFailure for isError (the model then gets `Error: ...`)."""
        if self.is_error:
            raise ToolFailure(self.text.strip() or f"the tool {self.tool} reported an error")
        return self.text

    def record(self) -> dict[str, Any]:
        """As a JSON record (`llmchat mcp call --json`): the text, and each block's kind, annotations
        and saved file."""
        blocks: list[dict[str, Any]] = []
        for block, marks in zip(self.blocks, self.annotations):
            entry: dict[str, Any] = {"type": block.kind}
            if marks:
                entry["annotations"] = marks
            if block.saved is not None:
                entry["path"] = str(block.saved.path)
                entry["mime_type"] = block.saved.mime_type
                entry["bytes"] = block.saved.size
            blocks.append(entry)
        record: dict[str, Any] = {"tool": self.tool, "is_error": self.is_error, "text": self.text, "blocks": blocks}
        if self.structured is not None:
            record["structured_content"] = self.structured
        return record


def handle_result(
    tool: str, result: Any, output_schema: dict[str, Any] | None, media_dir: Path, notify: Notify
) -> HandledResult:
    """A CallToolResult handled: media saved (and named to the person through notify), structured
    content checked against the outputSchema. ToolFailure for content that cannot be handled."""
    content = list(result.content)
    blocks = tuple(block_text(block, media_dir, tool) for block in content)
    for block in blocks:
        if block.saved is not None:
            notify(f"{tool} returned {block.kind} {block.saved.mime_type}: saved to {block.saved.path}")
    annotations = tuple(_annotations(block) for block in content)
    structured = result.structured_content
    texts = [block.text for block in blocks]
    if structured is not None and not result.is_error:
        checked = structured_text(tool, structured, output_schema)
        if not any(block.kind == "text" and _repeats(block.text, structured) for block in blocks):
            texts = [checked, *texts]  # no text block says it: the JSON goes first
    return HandledResult(tool, "\n".join(texts), blocks, annotations, structured, bool(result.is_error))


def _annotations(block: Any) -> dict[str, Any] | None:
    annotations = getattr(block, "annotations", None)
    if annotations is None:
        return None
    dumped: dict[str, Any] = annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped or None
