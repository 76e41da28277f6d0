"""kombu's Redis transport with two fixes: a channel closes whole when its server is gone, and
its visibility sweep skips a turn when Redis refuses writes at its maxmemory (`QoS`).

kombu's channel, closed while its BRPOP waits, first reads that BRPOP's reply; with the server
gone the read raises, and the rest of the close (giving back the deliveries taken and not
acknowledged, marking the channel closed) never runs. Celery's consumer, on losing the broker,
closes the connection twice (`collect`, then `close`), detaching the transport in between: the
second close then gave the deliveries back through a transport with no connection, raised
AttributeError, and Celery ended its consumer ("Unrecoverable error"). The worker ran on and
never delivered a webhook again. It took a Redis restart or failover while a threads-pool
delivery was in hand (CONVEYOR_WEBHOOK_CONCURRENCY above 1; the solo pool holds none while
the consumer waits). Here the rest of the close runs on the first try, while the transport
still knows its server: deliveries it cannot give back stay in kombu's unacknowledged hash,
restored a visibility timeout later as a dead worker's are.

kombu takes the transport from the URL's scheme again at each failover switch, so the class is
named by a scheme of its own (`SCHEME`) rather than by Celery's `broker_transport`."""

from __future__ import annotations

from typing import Any

from kombu.transport import TRANSPORT_ALIASES, redis
from redis.exceptions import OutOfMemoryError

SCHEME = "conveyor-redis"


class QoS(redis.QoS):
    def restore_visible(self, *args: Any, **kwargs: Any) -> Any:
        """kombu's sweep of deliveries past their visibility timeout, which the consumer runs
        at its start and then every so often: its lock is a write, which a Redis at its
        maxmemory refuses, and kombu called that unrecoverable: a worker starting then ended.
        Skipped this once; the next sweep restores them."""
        try:
            return super().restore_visible(*args, **kwargs)
        except OutOfMemoryError:
            return None


class Channel(redis.Channel):
    QoS = QoS

    def close(self) -> None:
        try:
            super().close()
        except self.connection_errors:
            if not self.closed:  # the BRPOP's read raised before anything else was done
                super().close()  # its read is over (`_in_poll` reset): the rest runs now
            raise


class Transport(redis.Transport):
    Channel = Channel


TRANSPORT_ALIASES[SCHEME] = f"{__name__}:Transport"
