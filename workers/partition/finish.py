"""What becomes of one delivered entry: the result the writer stores and acknowledges, the reply
the waiting producer gets, and the webhook event, all from one value."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shared.codec import OUTPUTS_TEXT, dumps
from shared.job_states import JobStatus
from shared.job_store import job_view


@dataclass(slots=True)
class Finish:
    """One entry's fate: `status` '' only acknowledges it (already terminal, cancelled, gone)."""

    entry_id: bytes
    job_id: str = ""
    reply: str = ""
    status: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    context: Mapping[str, str] = field(default_factory=dict)
    webhook: str = ""
    tenant: str = "default"  # who owns the job: its webhook event is signed with their key
    inflight: str = ""  # the API key's in-flight set holding the job, freed with the write
    refill: bool = False  # the write-back moves a held job in (Partition.refills)
    # this result's own: a write-back retried after its reply was lost finds it in the hash
    write_id: str = field(default_factory=lambda: secrets.token_hex(8))
    # the end the API gave the job while it ran (`cancelled`, `expired`; `cancelled` too for
    # a hash gone meanwhile, as the loop reads one), which FINISH met instead of writing this
    # result; the writer sets it, for the loop to count the job and end its token stream as
    # the record says without reading the job's status again
    met: str = ""
    # a generation's: its client read its tokens as they came, so what it ran to stays on the
    # record of a cancel FINISH meets, as an aborted generation's does (not made for no one)
    streamed: bool = False
    # its view takes the `created` its job's hash holds, which FINISH reads: an entry that was
    # no job (UndecodableEntry, Partition.undecodable) has only its read to stamp it with, and
    # its reply said its job was created then
    restamped: bool = False

    def unstamped(self) -> Finish:
        """Itself without `created`, whose view FINISH stamps with its hash's (`restamped`)."""
        return replace(self, context={k: v for k, v in self.context.items() if k != "created"})

    def stamp(self, created: str, webhook: str) -> None:
        """Take what FINISH read from the job's hash (`restamped`): its `created`, for its
        webhook event and a reply sent after FINISH (`CONVEYOR_REPLICA_ACKS`), and its
        `webhook`, which the unreadable payload did not name (FINISH owes its event)."""
        if created:
            self.context = {**self.context, "created": created}
        self.webhook = self.webhook or webhook

    def record(self) -> dict[str, str]:
        """The fields FINISH writes to the job's hash. A job the API cancelled while it ran
        keeps the cancel's end (`finished`) and gets no `write_id`: it holds no result of this
        worker's, so a write-back retried after its reply was lost neither replies nor notifies
        for it. The rest (its outputs so far, token counts) is what it ran to."""
        if self.status == JobStatus.CANCELLED:
            return {name: value for name, value in self.fields.items() if name != "finished"}
        return {"write_id": self.write_id, **self.fields}

    def _fields(self) -> dict[str, str]:
        return {**self.context, **self.fields, "status": self.status}

    def view(self) -> dict[str, Any]:
        return job_view(self.job_id, self._fields())

    def message(self) -> bytes:
        """The reply published to the waiting producer: the job's public view, its outputs as
        the JSON text they were already encoded to (shared/codec.OUTPUTS_TEXT: neither side
        decodes them; doing so was a third of a GPU worker's CPU, and of each producer's)."""
        if not self.status:
            return b""
        fields = self._fields()
        outputs = fields.pop("outputs", None)
        view = job_view(self.job_id, fields)
        if outputs is not None:
            view[OUTPUTS_TEXT] = outputs
        return dumps(view)


def ended_as_finished(written: list[Finish], finishes: list[Finish]) -> list[Finish]:
    """The jobs a write-back ended, each once, in the state it ended in: a written result in its
    own, and a job the API ended while it ran (a cancel, its Batch API batch's expiry, its hash
    gone) in the end FINISH met (`Finish.met`), which no other count takes: the API counts only
    the queued jobs it withdraws, and such a job counted in no state."""
    return [*written, *(replace(f, status=f.met) for f in finishes if f.met)]
