"""The resources and prompts of one MCP server: listed (page by page, bounded), a resource read
(text, or a blob's bytes kept in memory), a prompt got as its messages' text. Each request runs
as McpLoop runs one; a failure is an McpFailure of one line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from llmchat.tools.mcp.catalog import (
    PromptInfo,
    PromptMessageText,
    ResourceContent,
    ResourceInfo,
    ResourceTemplateInfo,
    prompt_info,
    resource_info,
    template_info,
)
from llmchat.tools.mcp.failures import McpFailure
from llmchat.tools.mcp.loop import PAGE_LIMIT, McpLoop
from llmchat.tools.mcp.results import block_text, decoded
from llmchat.tools.spec import ToolFailure


class ResourcesAndPrompts(McpLoop):
    """The resources-and-prompts role of McpConnection."""

    def _listing(self, what: str, fetch: Callable[[str | None], Awaitable[Any]], field: str) -> list[Any]:
        async def walk() -> list[Any]:
            items: list[Any] = []
            cursor: str | None = None
            for _ in range(PAGE_LIMIT):
                page = await fetch(cursor)
                items.extend(getattr(page, field))
                cursor = page.next_cursor
                if not cursor:
                    break
            return items

        return self._request(what, walk)

    def list_resources(self) -> tuple[ResourceInfo, ...]:
        if not self._capable("resources"):
            return ()
        listed = self._listing(
            "listing its resources",
            lambda cursor: self._client.list_resources(cursor=cursor, cache_mode="bypass"),
            "resources",
        )
        return tuple(resource_info(resource) for resource in listed)

    def list_resource_templates(self) -> tuple[ResourceTemplateInfo, ...]:
        if not self._capable("resources"):
            return ()
        listed = self._listing(
            "listing its resource templates",
            lambda cursor: self._client.list_resource_templates(cursor=cursor, cache_mode="bypass"),
            "resource_templates",
        )
        return tuple(template_info(template) for template in listed)

    def read_resource(self, uri: str) -> tuple[ResourceContent, ...]:
        """The resource's contents: text, or a blob's bytes (kept in memory, never saved to a file)."""
        self._require("resources", f"it has no resources to read ({uri})")

        async def read() -> Any:
            return await self._client.read_resource(uri, cache_mode="bypass")

        result = self._request(f"reading {uri}", read)
        contents: list[ResourceContent] = []
        for part in result.contents:
            text = getattr(part, "text", None)
            if isinstance(text, str):
                contents.append(ResourceContent(str(part.uri), part.mime_type, text))
                continue
            mime = part.mime_type or "application/octet-stream"
            try:
                data = decoded(str(part.blob), mime)
            except ToolFailure as err:
                raise McpFailure(f"{self.label}: reading {uri}: {err}") from None
            placeholder = f"[resource {part.uri}: {mime}, {len(data)} bytes]"
            contents.append(ResourceContent(str(part.uri), part.mime_type, placeholder, data))
        return tuple(contents)

    def list_prompts(self) -> tuple[PromptInfo, ...]:
        if not self._capable("prompts"):
            return ()
        listed = self._listing(
            "listing its prompts",
            lambda cursor: self._client.list_prompts(cursor=cursor, cache_mode="bypass"),
            "prompts",
        )
        return tuple(prompt_info(prompt) for prompt in listed)

    def get_prompt(self, name: str, arguments: dict[str, str]) -> tuple[PromptMessageText, ...]:
        """The prompt's messages, each as its role and its content as text."""
        self._require("prompts", f"it has no prompts ({name})")

        async def get() -> Any:
            return await self._client.get_prompt(name, dict(arguments))

        result = self._request(f"getting the prompt {name}", get)
        messages: list[PromptMessageText] = []
        for message in result.messages:
            try:
                text = block_text(message.content, self._media_dir(), f"{self.server.name}-{name}").text
            except ToolFailure as err:
                raise McpFailure(f"{self.label}: the prompt {name}: {err}") from None
            messages.append(PromptMessageText(str(message.role), text))
        return tuple(messages)
