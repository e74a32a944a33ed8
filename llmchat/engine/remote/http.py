"""The HTTP client both remote engines share: JSON requests and server-sent-event streams.

httpx, not requests: requests' `iter_lines` holds data back until its 512-byte chunk fills, which
delays tokens and inflates TTFT (koboldcpp#1411, psf/requests#2433). The SSE framing is parsed
here (a dozen lines) rather than with httpx-sse: llmchat needs only `data:` fields, and both
llama-server and vLLM put one JSON object per event.

Every failure leaves through `llmchat.engine.remote.failures` as one line; the API key travels only
in the Authorization header.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

from llmchat.engine.remote.failures import from_status, from_transport, stream_error
from llmchat.errors import ServerError

if TYPE_CHECKING:
    import httpx

    from llmchat.engine.remote.spec import ServerSpec

# batch --parallel allows up to 64 concurrent streams; a few more for tokenizing alongside.
_MAX_CONNECTIONS = 72


class ServerClient:
    """One connection pool to one server; thread-safe (batch --parallel streams from threads)."""

    def __init__(self, spec: ServerSpec):
        import httpx

        from llmchat import __version__

        self.spec = spec
        self.url = spec.url
        headers = {"User-Agent": f"llmchat/{__version__}"}
        if spec.api_key:
            headers["Authorization"] = f"Bearer {spec.api_key}"
        self._http = httpx.Client(
            base_url=spec.url,
            headers=headers,
            timeout=httpx.Timeout(spec.read_timeout, connect=spec.connect_timeout),
            limits=httpx.Limits(max_connections=_MAX_CONNECTIONS, max_keepalive_connections=_MAX_CONNECTIONS),
        )

    def close(self) -> None:
        self._http.close()

    def _fail_transport(self, err: Exception, what: str) -> ServerError:
        return from_transport(
            err,
            url=self.url,
            what=what,
            connect_timeout=self.spec.connect_timeout,
            read_timeout=self.spec.read_timeout,
        )

    def _fail_status(self, response: httpx.Response, what: str) -> Exception:
        return from_status(response, url=self.url, what=what, secret=self.spec.api_key, model=self.spec.model)

    def probe(self, path: str) -> httpx.Response | None:
        """GET `path` for kind detection: the response whatever its status, None when the server sent
        nothing usable. A server that cannot be reached at all raises (no probe can succeed then)."""
        import httpx

        try:
            return self._http.get(path)
        except (httpx.ConnectError, httpx.ConnectTimeout) as err:
            raise self._fail_transport(err, f"GET {path}") from None
        except httpx.HTTPError:
            return None

    def alive(self) -> bool:
        """Whether anything still answers at this server's address (`GET /health`, within the connect
        timeout): a batch asks after a dropped connection, to tell a server that is gone from one
        that dropped one stream. Any answer counts, except a proxy's 502/504 (nothing behind it)."""
        import httpx

        try:
            response = self._http.get("/health", timeout=self.spec.connect_timeout)
        except httpx.HTTPError:
            return False
        return response.status_code not in (502, 504)

    def get_json(self, path: str) -> Any:
        return self._request("GET", path, None)

    def post_json(self, path: str, payload: dict[str, Any]) -> Any:
        return self._request("POST", path, payload)

    def _request(self, method: str, path: str, payload: dict[str, Any] | None) -> Any:
        import httpx

        what = f"{method} {path}"
        try:
            try:
                response = self._http.request(method, path, json=payload)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                # A kept-alive connection the server had already closed (llama-server closes one
                # after a stream): these requests change nothing on the server, so ask once more.
                response = self._http.request(method, path, json=payload)
        except httpx.HTTPError as err:
            raise self._fail_transport(err, what) from None
        if response.status_code >= 400:
            raise self._fail_status(response, what)
        try:
            return response.json()
        except ValueError:
            raise ServerError(
                f"{self.spec.shown_url}: {what} answered with something that is not JSON; is --server the right "
                "URL for this kind of server?"
            ) from None

    def stream_events(self, path: str, payload: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
        """POST `payload` and yield each SSE `data:` object until `[DONE]` or the end of the stream.

        Closing the generator (the consumer stops early, Ctrl-C) closes the connection, which tells
        the server to stop generating."""
        import httpx

        what = f"POST {path}"
        try:
            with self._http.stream("POST", path, json=payload) as response:
                if response.status_code >= 400:
                    response.read()
                    raise self._fail_status(response, what)
                for data in _sse_data(response.iter_lines()):
                    if data == "[DONE]":
                        return
                    try:
                        event = json.loads(data)
                    except ValueError:
                        raise ServerError(
                            f"{self.spec.shown_url}: {what} sent an event that is not JSON; check the server"
                        ) from None
                    if isinstance(event, dict) and "error" in event and not event.get("choices"):
                        raise stream_error(event, url=self.url, what=what, secret=self.spec.api_key)
                    yield event
        except httpx.HTTPError as err:
            raise self._fail_transport(err, what) from None


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The `data` of each server-sent event (fields joined with newlines); comments and other fields
    (`event:`, `id:`, `retry:`, `: ping`) are skipped."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)
