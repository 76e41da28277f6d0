"""The console's long-lived parts, built once in the app's lifespan and held on `app.state`: the
session signer, the record of open sessions, the count of failed logins, and the summaries loop
that every viewer reads."""

from __future__ import annotations

from dataclasses import dataclass

from producer_api.console.live_sessions import LiveSessions
from producer_api.console.login_throttle import LoginThrottle
from producer_api.console.session import SessionSigner
from producer_api.console.summaries import ConsoleSummaries
from producer_api.state import ProducerState


@dataclass(slots=True)
class Console:
    signer: SessionSigner
    sessions: LiveSessions
    logins: LoginThrottle
    summaries: ConsoleSummaries

    @classmethod
    def build(cls, state: ProducerState) -> Console:
        settings = state.settings
        return cls(
            SessionSigner(settings.console_secret),
            LiveSessions(state.redis, state.keys, settings.console_idle_timeout_s),
            LoginThrottle(state.redis, state.keys, settings.console_login_failures_per_minute),
            ConsoleSummaries(state),
        )

    def start(self) -> None:
        self.summaries.start()

    async def stop(self) -> None:
        await self.summaries.stop()
