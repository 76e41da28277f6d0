"""kombu's Redis transport with two fixes: a channel closes whole when its server is gone, and a
Redis at its maxmemory is an outage to kombu, not a fault (`Transport`).

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

from kombu.transport import TRANSPORT_ALIASES, redis
from redis.exceptions import OutOfMemoryError

SCHEME = "conveyor-redis"


class Channel(redis.Channel):
    def close(self) -> None:
        try:
            super().close()
        except self.connection_errors:
            if not self.closed:  # the BRPOP's read raised before anything else was done
                super().close()  # its read is over (`_in_poll` reset): the rest runs now
            raise


class Transport(redis.Transport):
    """A Redis at its maxmemory (noeviction) refuses writes: kombu called its OutOfMemoryError
    unrecoverable, so a worker whose Celery consumer started then (its pidbox binding, its
    visibility sweep: writes) ended, and a running one lost its consumer at its first refused
    write. As a connection error of kombu's, Celery's consumer reconnects and backs off until
    memory frees, as for MISCONF, and a publish is retried by kombu's policy. Only here: the
    producer's own clients keep the plain class, whose refusal is a 503, and redis-py does not
    retry it or drop its connection (a pipeline's error as a redis-py connection error did)."""

    Channel = Channel
    connection_errors = (*redis.Transport.connection_errors, OutOfMemoryError)


TRANSPORT_ALIASES[SCHEME] = f"{__name__}:Transport"
