"""The request boundary's check of a parsed JSON body costs about what the body does. It kept a
pending entry, with its whole path as a new tuple, for every value of every array: a 1 MiB body
of small values (`[1,1,…]` or `[[],[],…]`) took some 80 MB and most of a second of the event
loop, every other request waiting; a batch upload checks each of its lines so. The checking
parser (for a body orjson refuses, or one with a float past 64 bits) called into Python for each
number besides. What it refuses stays as it was; an oversized integer or a number that is not
finite is now named by where it is, as a lone surrogate and deep nesting were."""

from __future__ import annotations

import tracemalloc

import orjson
import pytest

from producer_api.request_boundary import UnstorableJson, check_value, parse_json

WIDE = 50_000  # values in one array: a body of some 100 KB


def _peak_bytes(value: object) -> int:
    """The most memory `check_value` held at once while checking `value`."""
    tracemalloc.start()
    try:
        check_value(value, 64)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("item", [b"1", b"[]", b'"x"', b'{"a":null}'])
def test_a_wide_array_is_checked_without_a_copy_per_value(item: bytes) -> None:
    body = b'{"inputs": {"a": [' + b",".join([item] * WIDE) + b"]}}"
    value = orjson.loads(body)
    # a pending entry and path per value held some 150 bytes each: 7 MB here
    assert _peak_bytes(value) < 64 * 1024


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"a": [1, {"b": "\\ud800"}]}', "a.1.b: a lone surrogate"),
        (b'{"a": {"\\udfff": 1}}', "a: a lone surrogate"),
        (b'{"a": [0, %s]}' % (b"[" * 70 + b"]" * 70), "a.1.0.0.0"),
        (b'{"a": [[], %s]}' % (b"[" * 63 + b"]" * 63), "nested deeper than 64 levels"),
        (b'{"a": [1, 18446744073709551616]}', "a.1: integer 18446744073709551616"),
        (b'{"a": -9223372036854775809}', "does not fit in 64 bits"),
        (b'{"a": {"b": 1e400}}', "a.b: number inf is not finite"),
        (b'{"a": NaN}', "not a number JSON allows"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper than 64 levels"),
    ],
)
def test_what_is_refused_says_where(body: bytes, says: str) -> None:
    with pytest.raises(UnstorableJson, match=says.replace(".", r"\.")):
        parse_json(body, 64)


def test_what_fits_comes_back_exact() -> None:
    body = b'{"a": [18446744073709551615, -9223372036854775808, 1e300, "\\u00e9", [[]]], "b": {}}'
    assert parse_json(body, 64) == {
        "a": [2**64 - 1, -(2**63), 1e300, "é", [[]]],
        "b": {},
    }
    assert parse_json(b"[" * 64 + b"]" * 64, 64) is not None
