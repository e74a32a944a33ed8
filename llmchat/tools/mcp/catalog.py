"""A server's resources and prompts, as small frozen values (no SDK type leaves llmchat.tools.mcp).

McpConnection.list_resources(), list_resource_templates(), read_resource(uri), list_prompts() and
get_prompt(name, arguments) return these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# RFC 6570 expressions: {var}, {+var}, {#var}, {?a,b}, {/var*} ...; the names are the arguments.
_EXPRESSION = re.compile(r"\{[+#./;?&=,!@|]?([^}]*)\}")


@dataclass(frozen=True)
class ResourceInfo:
    uri: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class ResourceTemplateInfo:
    uri_template: str
    name: str
    arguments: tuple[str, ...]  # the template's variables, in order
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None


@dataclass(frozen=True)
class ResourceContent:
    """One part of a read resource: its own text, or for a blob its bytes (`data`, the text then a
    placeholder). A blob is not saved to a file: what reads it (`-f mcp:SERVER/URI`) takes its
    bytes, so a file would only be a copy of the conversation left behind."""

    uri: str
    mime_type: str | None
    text: str
    data: bytes | None = None


@dataclass(frozen=True)
class PromptArgumentInfo:
    name: str
    description: str | None = None
    required: bool = False


@dataclass(frozen=True)
class PromptInfo:
    name: str
    arguments: tuple[PromptArgumentInfo, ...] = ()
    title: str | None = None
    description: str | None = None


@dataclass(frozen=True)
class PromptMessageText:
    """One message of a prompt: its role (user or assistant) and its content as text."""

    role: str
    text: str


def template_arguments(uri_template: str) -> tuple[str, ...]:
    names: list[str] = []
    for expression in _EXPRESSION.findall(uri_template):
        for part in expression.split(","):
            name = re.sub(r"(\*|:\d+)$", "", part.strip())
            if name and name not in names:
                names.append(name)
    return tuple(names)


def resource_info(resource: Any) -> ResourceInfo:
    return ResourceInfo(
        uri=str(resource.uri),
        name=str(resource.name),
        title=resource.title,
        description=resource.description,
        mime_type=resource.mime_type,
        size=resource.size,
    )


def template_info(template: Any) -> ResourceTemplateInfo:
    return ResourceTemplateInfo(
        uri_template=str(template.uri_template),
        name=str(template.name),
        arguments=template_arguments(str(template.uri_template)),
        title=template.title,
        description=template.description,
        mime_type=template.mime_type,
    )


def prompt_info(prompt: Any) -> PromptInfo:
    arguments = tuple(
        PromptArgumentInfo(str(argument.name), argument.description, bool(argument.required))
        for argument in prompt.arguments or ()
    )
    return PromptInfo(str(prompt.name), arguments, prompt.title, prompt.description)
