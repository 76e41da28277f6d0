"""One partition a worker serves, (model, variant) with its two lane streams, and how a delivered
entry of it ends, for every partition loop alike: entries that must not run (already ended,
cancelled, gone) are only acknowledged, late ones expire, and every result carries the same
timing and context fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from shared.codec import dumps
from shared.job_states import UNDECODABLE_ENTRY, JobStatus
from shared.job_store import stamp_ms
from shared.keys import Keys
from shared.model_repository import ModelConfig
from workers.partition.finish import Finish
from workers.partition.stream_reader import Delivery, Undecodable

INPUTS_KEPT = 4_096  # bytes of a failed job's inputs kept in its hash (its entry is deleted)


@dataclass(frozen=True, slots=True)
class Partition:
    config: ModelConfig
    variant: str
    online: str
    bulk: str

    @classmethod
    def of(cls, keys: Keys, config: ModelConfig, variant: str) -> Partition:
        return cls(
            config, variant, keys.queue(config.name, variant), keys.bulk_queue(config.name, variant)
        )

    @property
    def streams(self) -> tuple[str, str]:
        """The lane streams, online first (the order reclaim serves them in)."""
        return self.online, self.bulk

    def refills(self, delivery: Delivery) -> bool:
        """Whether the write-back of `delivery` should move a held job into its lane: in a fair
        lane always (it keeps a blocked worker awake), elsewhere only after an entry round
        robin moved in (jobs a producer with `queue.fair` on held back, under a worker whose
        config has it off, still drain); a plain lane's write-back then skips the look."""
        return self.config.fair_window_of(self.variant) > 0 or delivery.moved

    @property
    def touch_every_s(self) -> float:
        """How often a long run re-claims its entries: well within the visibility timeout, so
        no reclaimer takes a job still running for an abandoned one."""
        return self.config.queue.visibility_timeout_s / 3

    @property
    def max_batch_size(self) -> int:
        return self.config.max_batch_size_of(self.variant)

    @property
    def name(self) -> str:
        """`model:variant`, as logs and the CLI spell a partition."""
        return f"{self.config.name}:{self.variant}"

    @property
    def labels(self) -> tuple[str, str]:
        """The Prometheus labels of this partition: (model, variant)."""
        return self.config.name, self.variant

    def skip_or_expire(self, delivery: Delivery) -> Finish | None:
        """The Finish of an entry that must not run, or None when it should run."""
        entry = delivery.entry
        if entry is None and delivery.undecodable is not None:
            return self.undecodable(delivery, delivery.undecodable)
        if entry is None or not delivery.runnable:
            return Finish(delivery.entry_id, refill=self.refills(delivery))
        now = delivery.claimed_ms
        max_wait_ms = self.config.queue.max_queue_time_s * 1000.0
        # max_queue_time bounds a wait in the queue: a job run again after its worker died has
        # waited its first run and the visibility timeout too (only its deadline bounds it then)
        queued = not entry.batch and not delivery.redelivered
        waited_too_long = queued and now - entry.enqueued_ms > max_wait_ms
        if (entry.deadline_ms and now > entry.deadline_ms) or waited_too_long:
            error = {"type": "DeadlineExceeded", "message": "job expired before it could run"}
            expired = self.finish(delivery, JobStatus.EXPIRED, {"error": dumps(error).decode()})
            if entry.window_ended:  # the batch's end, which its own webhook reports (README)
                expired.webhook = ""
            return expired
        return None

    def undecodable(self, delivery: Delivery, refused: Undecodable) -> Finish:
        """The failure of the job an entry that is no job names, saying why: acknowledged only,
        it stayed `queued` until its TTL, its client polling for a result that never came.
        FINISH fails it only from `queued` or `running`: a job that ended keeps its end."""
        message = f"its queue entry cannot be read as a job: {refused.reason}"
        error = dumps({"type": UNDECODABLE_ENTRY, "message": message}).decode()
        named = replace(delivery, entry=refused.entry)
        finish = self.finish(named, JobStatus.FAILED, {"error": error})
        finish.restamped = True  # its `created`, the read's, is its hash's once FINISH reads it
        finish.fields |= _inputs(refused.payload)  # as it came, not the empty one it stands for
        # no wait is known: the entry's stamp is untrusted, the hash's `created` (the truth,
        # which FINISH leaves) unread here, and the stamp it stands for (the read) made one of 0
        del finish.fields["queue_wait_ms"]
        return finish

    def finish(
        self,
        delivery: Delivery,
        status: JobStatus,
        fields: dict[str, str],
        ran_ms: float | None = None,
    ) -> Finish:
        """A result for the writer, with `finished`, `queue_wait_ms`, the reply's context and
        the job's webhook. The queue wait ends when the engine started on the job (`ran_ms`),
        or, for a job no engine ran, when this worker read it."""
        assert delivery.entry is not None
        entry = delivery.entry
        ran = delivery.claimed_ms if ran_ms is None else ran_ms
        fields = {
            **fields,
            "started": str(delivery.claimed_ms),  # when this worker read it: no claim writes it
            "attempts": str(delivery.attempts),
            # rounded up, as `created` is down: the whole ms between them (`total_ms`) never
            # read shorter than the queue wait and engine time inside it, which are to the µs
            "finished": str(math.ceil(stamp_ms())),
            # never below 0: the read is stamped to the whole ms (and on another host's clock),
            # the enqueue to the µs, so a job read in the ms it came read -0.247
            "queue_wait_ms": str(round(max(0, ran - entry.enqueued_ms), 3)),
        }
        if status != JobStatus.SUCCEEDED:  # the console shows what a failed job was given
            fields |= _inputs(dumps(entry.payload))
        if entry.traceparent:
            fields["traceparent"] = entry.traceparent
        context = {
            "model": self.config.name,
            "variant": self.variant,
            "created": str(int(entry.enqueued_ms)),
            "started": str(delivery.claimed_ms),
        }
        if entry.replay_of:
            context["replay_of"] = entry.replay_of
        webhook = str(entry.payload.get("webhook", ""))
        return Finish(
            delivery.entry_id,
            entry.job_id,
            entry.reply,
            status,
            fields,
            context,
            webhook,
            entry.tenant,
            entry.inflight,
            refill=self.refills(delivery),
        )


def _inputs(raw: bytes) -> dict[str, str]:
    """The fields that keep a failed job's payload (`raw` JSON), up to INPUTS_KEPT bytes."""
    return {"inputs": raw[:INPUTS_KEPT].decode(errors="ignore"), "inputs_size": str(len(raw))}
