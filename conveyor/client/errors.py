"""Errors the SDK raises: the server's `{"error": {type, message}}` as a typed exception (one
class per status a caller is likely to handle), and timeouts of client-side waits."""

from __future__ import annotations

from typing import Any

import httpx


class ConveyorError(Exception):
    """Base of everything the SDK raises on purpose."""


class InvalidArgument(ValueError):
    """An argument no request could carry (an empty id, a NaN timeout): refused before any is
    sent."""


class APIError(ConveyorError):
    def __init__(
        self, status: int, type_: str, message: str, headers: httpx.Headers | None = None
    ) -> None:
        super().__init__(f"{status} {type_}: {message}")
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers or httpx.Headers()

    @property
    def request_id(self) -> str | None:
        """The answer's `X-Request-ID` (an internal error's, its traceback logged under it; a
        chat's, its job), the id to quote to the operator, as OpenAI's SDK errors carry it:
        it was only in `headers`, or in the message's text."""
        return self.headers.get("X-Request-ID")

    def __reduce__(self) -> tuple[type[APIError], tuple[int, str, str, httpx.Headers]]:
        """Pickled as its fields (a Celery task's error, a process pool's): rebuilt from
        `args`, its one formatted line, it raised TypeError where it was unpickled."""
        return type(self), (self.status, self.type, self.message, self.headers)


class AuthError(APIError):
    """401 or 403: the API key is missing, unknown, or not allowed to do this."""


class NotFound(APIError):
    pass


class Conflict(APIError):
    """409: e.g. cancelling something that already ended, or reading files of a running batch."""


class RateLimited(APIError):
    """429 after the retries ran out; `Retry-After` is in `headers`."""


class Unavailable(APIError):
    """503, or a proxy's 502 or 504 (a body that is not the producer's), after the retries ran
    out: the statuses retried as an outage (`retries.UNAVAILABLE`); a proxy's were a bare
    APIError, which `except Unavailable` missed. The producer's own 502 (an engine's output of
    the wrong shape) and a predict's 504 (its job expired) stay APIErrors: no outage."""


_BY_STATUS: dict[int, type[APIError]] = {
    401: AuthError,
    403: AuthError,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
    503: Unavailable,
}
GATEWAY = frozenset({502, 504})  # a proxy's, when the body is not the producer's
NOT_THE_PRODUCERS = "http_error"  # the type of an error whose body is not the producer's


def api_error(
    status: int, type_: str, message: str, headers: httpx.Headers | None = None
) -> APIError:
    """The error of `status` as its class (Conflict for 409, ...), whether the answer's status
    says it or a job's end does (a predict's job cancelled after its 202 hand-off)."""
    if status in GATEWAY and type_ == NOT_THE_PRODUCERS:
        return Unavailable(status, type_, message, headers)
    return _BY_STATUS.get(status, APIError)(status, type_, message, headers)


def raise_for_error(response: httpx.Response) -> httpx.Response:
    """Return the response when it succeeded, else raise its APIError. A redirect is one:
    httpx follows none, and its body read as the answer was a JSONDecodeError (or, streamed,
    an empty stream). A body that is not the producer's (another server's HTML page) is the
    message on one line: its own lines made the CLI's one-line error a page of HTML."""
    status = response.status_code
    if status < 300:
        return response
    if status < 400:
        where = response.headers.get("Location", "nowhere named")
        message = f"redirected to {where}; set CONVEYOR_URL (or --url) to where it leads"
        raise api_error(status, "redirect", message, response.headers)
    type_, message = NOT_THE_PRODUCERS, response.reason_phrase
    try:
        body: Any = response.json()
        type_, message = body["error"]["type"], body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = " ".join(response.text[:2000].split())[:500] or message
    raise api_error(status, type_, message, response.headers)


class WaitTimeout(ConveyorError, TimeoutError):
    """A client-side wait ended first; `last` is the job or batch as last seen."""

    def __init__(self, message: str, last: Any) -> None:
        super().__init__(message)
        self.last = last

    def __reduce__(self) -> tuple[type[WaitTimeout], tuple[str, Any]]:
        """Pickled with the job or batch last seen, as `APIError` is with its fields."""
        return type(self), (str(self), self.last)


class StreamFailed(APIError):
    """A streamed answer that ended with an error chunk instead of its end (its HTTP status,
    `status`, was 200): `type` says why, as the whole answer's error would (`unavailable`: the
    producer stopped; `unauthorized`: the key was revoked; `restarted`; `failed`, `cancelled`,
    `expired`)."""


class APIConnectionError(ConveyorError):
    """The producer could not be reached, the connection failed mid-request, or its answer
    came undecodable (a broken gzip body), and the retries ran out (or the request could not
    be resent safely); the httpx error is `__cause__`. It was that httpx error itself, which
    no `except ConveyorError` caught."""


class APITimeoutError(APIConnectionError):
    """The connection, or the answer, took longer than the client's timeout (as OpenAI's
    SDK names it; a `WaitTimeout` is a wait's own timeout, with the job)."""


# What httpx raises when the connection, or the encoding of an answer's body, fails: a
# DecodingError (a broken gzip body) is no TransportError, and escaped the SDK as httpx's own.
WIRE_ERRORS = (httpx.TransportError, httpx.DecodingError)
WireError = httpx.TransportError | httpx.DecodingError


def connection_error(error: WireError) -> APIConnectionError:
    """`error` as the SDK's: raise it `from error`."""
    kind = APITimeoutError if isinstance(error, httpx.TimeoutException) else APIConnectionError
    if isinstance(error, httpx.DecodingError):
        return kind(f"cannot decode the producer's answer: {error!r}")
    return kind(f"cannot reach the producer: {error!r}")


class StreamError(ConveyorError):
    """An event stream could not be resumed: no event came for its `reconnect_for_s`."""
