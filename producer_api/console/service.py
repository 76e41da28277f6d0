"""The console's long-lived parts, built once in the app's lifespan and held on `app.state`: the
session signer, the record of logged-out sessions, and the summaries loop that every viewer
reads."""

from __future__ import annotations

from dataclasses import dataclass

from producer_api.console.logouts import Logouts
from producer_api.console.session import MAX_AGE_S, SessionSigner
from producer_api.console.summaries import ConsoleSummaries
from producer_api.state import ProducerState


@dataclass(slots=True)
class Console:
    signer: SessionSigner
    logouts: Logouts
    summaries: ConsoleSummaries

    @classmethod
    def build(cls, state: ProducerState) -> Console:
        signer = SessionSigner(state.settings.console_secret)
        return cls(signer, Logouts(state.redis, state.keys, MAX_AGE_S), ConsoleSummaries(state))

    def start(self) -> None:
        self.summaries.start()

    async def stop(self) -> None:
        await self.summaries.stop()
