"""The console's long-lived parts, built once in the app's lifespan and held on `app.state`: the
session signer and the summaries loop that every viewer reads."""

from __future__ import annotations

from dataclasses import dataclass

from producer_api.console.session import SessionSigner
from producer_api.console.summaries import ConsoleSummaries
from producer_api.state import ProducerState


@dataclass(slots=True)
class Console:
    signer: SessionSigner
    summaries: ConsoleSummaries

    @classmethod
    def build(cls, state: ProducerState) -> Console:
        return cls(SessionSigner(state.settings.console_secret), ConsoleSummaries(state))

    def start(self) -> None:
        self.summaries.start()

    async def stop(self) -> None:
        await self.summaries.stop()
