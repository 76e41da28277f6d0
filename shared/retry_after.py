"""One reading of HTTP's `Retry-After` (RFC 9110 §10.2.3) for the SDK's retries and the
webhook worker's backoff: both waited what a server asked, and two parsers had drifted apart on
which numbers they took."""

from __future__ import annotations

import datetime
import email.utils
import math
import re
import time

_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")  # delay-seconds, a fraction allowed


def retry_after_s(value: str) -> float | None:
    """The wait `value` asks for, in seconds from now, or None when it says nothing readable.
    Only ASCII digits are a number: `float` also reads `1_000`, `1e3` and other scripts' digits,
    and `isdigit` takes `²` for one. Dates without a zone (asctime's, `-0000`) are GMT, as every
    HTTP date is: read as local time, an hour's wait was six on a host five hours behind GMT."""
    if _SECONDS.fullmatch(value.strip()):
        seconds = float(value)
        return seconds if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):  # a year past C's int: OverflowError
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - time.time())
