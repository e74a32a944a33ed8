"""An MCP server over stdio that returns media (the real SDK's MCPServer, run as a real process).

- the tool `picture` returns one small PNG image (always the same bytes);
- the tool `recording` returns a short WAV clip;
- the resource `note://blob` is a blob: a sentence's UTF-8 bytes, sent base64 as servers send binary.
"""

import base64

from mcp.server import MCPServer
from mcp.server.mcpserver import Audio, Image

# A 1x1 PNG (a red pixel).
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
# A WAV header with no samples.
WAV = b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00@\x1f\x00\x00\x80>\x00\x00\x02\x00\x10\x00data\x00\x00\x00\x00"

server = MCPServer("media")


@server.tool()
def picture() -> Image:
    """A small picture."""
    return Image(data=PNG, format="png")


@server.tool()
def recording() -> Audio:
    """A short recording."""
    return Audio(data=WAV, format="wav")


@server.resource("note://blob", mime_type="text/plain")
def blob_note() -> bytes:
    """A note kept as a blob."""
    return "A note kept as a blob, private.".encode("utf-8")


if __name__ == "__main__":
    server.run("stdio")
