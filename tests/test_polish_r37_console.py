"""The console's live feed carries no batch `urls`: console.js builds every batch link under
its own base (`home()`), and those paths lacked the root path (`self` named no console
route), so the field was dead weight in every viewer's event each second."""

from __future__ import annotations

from producer_api.console.summaries import ConsoleSummaries
from producer_api.state import ProducerState
from shared.job_store import now_ms
from tests.test_console_bounds import HOUR_MS, _running_batch, state  # noqa: F401 (`state`)


async def test_the_live_feed_shows_a_batch_without_urls(state: ProducerState) -> None:  # noqa: F811
    batch_id = await _running_batch(state, "acme", 2, now_ms() + HOUR_MS)
    summaries = ConsoleSummaries(state)
    await summaries.step()
    [shown] = summaries.snapshot["batches"]
    assert shown["id"] == batch_id and shown["counts"]["pending"] == 2
    assert "urls" not in shown, shown["urls"]
