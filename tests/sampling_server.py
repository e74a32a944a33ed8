"""A small MCP server (the SDK's MCPServer, over stdio) whose tools ask the client's model for a
completion (`sampling/createMessage`), in the 2026-07-28 way: the call's result asks
(InputRequiredResult) and the call comes again with the answer, which the tool returns as JSON.
`complete` asks a well-formed request of 8 tokens at temperature 0; the others break a rule
llmchat checks (too many tokens, image content, the assistant's message last).
For tests/test_mcp_sampling.py: `python tests/sampling_server.py`."""

import json
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CreateMessageRequest,
    CreateMessageRequestParams,
    ImageContent,
    InputRequiredResult,
    SamplingMessage,
    TextContent,
)

server = MCPServer("sampler")


def asked(ctx: Context, messages: list, max_tokens: int, **extra) -> InputRequiredResult | str:
    if ctx.input_responses:
        answer = ctx.input_responses["it"]
        return json.dumps(answer.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True)
    params = CreateMessageRequestParams(messages=messages, max_tokens=max_tokens, **extra)
    return InputRequiredResult(input_requests={"it": CreateMessageRequest(params=params)})


def user(text: str) -> SamplingMessage:
    return SamplingMessage(role="user", content=TextContent(type="text", text=text))


SYSTEM = "You are a helpful test server."


@server.tool()
async def complete(ctx: Context, prompt: str) -> InputRequiredResult | str:
    """Ask the client's model to answer the prompt."""
    return asked(ctx, [user(prompt)], 8, system_prompt=SYSTEM, temperature=0.0)


@server.tool()
async def too_long(ctx: Context, prompt: str) -> InputRequiredResult | str:
    """Ask for more tokens than a client allows."""
    return asked(ctx, [user(prompt)], 5000, system_prompt=SYSTEM)


@server.tool()
async def image_message(ctx: Context) -> InputRequiredResult | str:
    """A message with image content."""
    image = ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")
    return asked(ctx, [SamplingMessage(role="user", content=image)], 8)


@server.tool()
async def assistant_last(ctx: Context) -> InputRequiredResult | str:
    """The last message is the assistant's."""
    return asked(
        ctx, [user("Hi"), SamplingMessage(role="assistant", content=TextContent(type="text", text="Hello"))], 8
    )


if __name__ == "__main__":
    print("sampler ready", file=sys.stderr)
    server.run()
