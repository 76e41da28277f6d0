"""A value Settings accepts is one every later use takes: a TTL past what Redis's EXPIRE holds
failed every submit (or every webhook delivery's claim) after a clean start, a collection
threshold past a C int raised OverflowError as the process began to serve, and a key prefix or
instance id ending in a newline (a Kubernetes secret's) passed the printable-ASCII check, the
id then failing CLIENT SETNAME on every connection."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import redis
from pydantic import ValidationError

from shared.settings import MAX_GC_THRESHOLD, MAX_TTL_S, Settings, bad_setting


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("result_ttl_s", 10**17),  # EXPIRE: "invalid expire time"
        ("token_stream_ttl_s", 10**20),  # EXPIRE: "value is not an integer or out of range"
        ("webhook_retry_for_s", 1e300),
        ("gc_young_threshold", MAX_GC_THRESHOLD + 1),
        ("instance_id", "producer-1\n"),
        ("key_prefix", "cv:\n"),
    ],
)
def test_a_value_that_fails_at_first_use_is_a_bad_setting(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{field: value})  # type: ignore[arg-type]
    line = bad_setting(refused.value)
    assert line.startswith(f"bad setting: CONVEYOR_{field.upper()}="), line
    assert "\n" not in line, line


def test_redis_refuses_a_client_name_with_a_newline(redis_client: redis.Redis) -> None:
    """Why CONVEYOR_INSTANCE_ID must be refused with one: it names every producer connection."""
    with pytest.raises(redis.ResponseError):
        redis_client.client_setname("producer-1\n")


@pytest.fixture
def young_threshold() -> Iterator[None]:
    kept = gc.get_threshold()
    yield
    gc.set_threshold(*kept)


@pytest.mark.usefixtures("young_threshold")
def test_the_largest_gc_threshold_accepted_is_one_python_sets() -> None:
    settings = Settings(gc_young_threshold=MAX_GC_THRESHOLD)
    gc.set_threshold(settings.gc_young_threshold)  # as shared/heap_tuning.settle_heap does
    assert gc.get_threshold()[0] == MAX_GC_THRESHOLD


def test_the_longest_ttl_accepted_is_one_redis_expires_by(redis_client: redis.Redis) -> None:
    """With a batch's window (a day) on top, as producer_api/batch_api gives its records."""
    key = "test:settings-r11:ttl"
    redis_client.set(key, "1")
    try:
        assert redis_client.expire(key, Settings(result_ttl_s=MAX_TTL_S).result_ttl_s + 86_400)
        assert redis_client.ttl(key) > MAX_TTL_S
        with pytest.raises(redis.ResponseError):  # what every submit met before the bound
            redis_client.expire(key, 10**17)
    finally:
        redis_client.delete(key)
