"""What a partition loop reads from and writes to, bundled once by the consumer runtime: the
partition, its two lanes, the result writer, the reclaimers and the webhooks. The batching and
generate loops differ only in how they drive their engine."""

from __future__ import annotations

from dataclasses import dataclass

from shared.job_states import JobStatus
from shared.model_repository import ModelConfig
from workers.partition import job_finish
from workers.partition.job_events import JobEvents
from workers.partition.lane_scheduler import LaneScheduler
from workers.partition.reclaim import Reclaimer
from workers.partition.result_writer import Finish, ResultWriter
from workers.partition.stream_reader import Delivery


@dataclass(frozen=True, slots=True)
class PartitionIO:
    config: ModelConfig
    variant: str
    lanes: LaneScheduler
    writer: ResultWriter
    reclaimers: list[Reclaimer]
    webhooks: JobEvents
    block_ms: int

    async def reclaimed(self) -> tuple[str, list[Delivery]] | None:
        """The first lane's abandoned entries whose reclaim is due: (stream, deliveries)."""
        for reclaimer in self.reclaimers:
            if reclaimer.due() and (abandoned := await reclaimer.reclaim()):
                return reclaimer.stream, abandoned
        return None

    def skip_or_expire(self, delivery: Delivery) -> Finish | None:
        return job_finish.skip_or_expire(self.config, self.variant, delivery)

    def finish(self, delivery: Delivery, status: JobStatus, fields: dict[str, str]) -> Finish:
        return job_finish.finish(self.config, self.variant, delivery, status, fields)
