"""`/readyz` with no models in the repository is a 503 like its others, with `Retry-After`: it
came without one, unlike the 503s for Redis out of reach and a startup not yet run."""

from __future__ import annotations

from pathlib import Path

from producer_api.app import create_app
from shared.settings import Settings
from tests.app_client import app_client


async def test_a_producer_with_no_models_is_unready_with_retry_after(
    redis_url: str, tmp_path: Path
) -> None:
    settings = Settings(
        redis_url=redis_url, key_prefix="readyz-empty:", model_repository=str(tmp_path)
    )
    async with app_client(create_app(settings)) as client:
        got = await client.get("/readyz")
        head = await client.head("/readyz")
    assert "no models" in got.text
    for answer in (got, head):
        assert answer.status_code == 503 and answer.headers.get("retry-after") == "1"
