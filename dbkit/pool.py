"""The web server's connection pool hands out a connection without a round trip when its socket
says it is alive.

Django gives psycopg's pool `ConnectionPool.check_connection` when `CONN_HEALTH_CHECKS` is on:
an empty statement sent and answered each time a request takes a connection, that is once per
HTTP request. `check_quietly` asks the socket first. A connection that PostgreSQL closed (a
restart, `pg_terminate_backend`, `idle_session_timeout`) has its server's last message and the
end of the stream waiting on the socket, so the socket is readable: then, as for a connection not
idle in autocommit or not handed out for longer than `QUIET_FOR`, the full check runs and the pool
replaces the connection when it fails. A connection whose socket has nothing to say was answered
by PostgreSQL at its last use, which began less than `QUIET_FOR` ago, and goes out as it is.

The pool has no `reset` callback: with one, psycopg_pool hands every returned connection to its
worker thread (a queue and a thread switch per request, 3.6 % of the web process's CPU under the
API load) instead of putting it back in the returning thread.

What it does not see is what the empty statement would not see either in time: a peer that
vanished without closing (a host powered off, a dropped route) leaves a quiet socket, and the
request's first statement then fails as the check's would have.
"""

from __future__ import annotations

import select
import time
from typing import Any

from psycopg import OperationalError
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

# A connection idle for longer than this gets the full check: something between the hosts (a NAT,
# a firewall) may have forgotten it without a word to either end.
QUIET_FOR = 30.0

_last_checked_attribute = "_taskplatform_checked_at"


def _socket_has_news(conn: Any) -> bool:
    """Whether the server sent anything (an error, the end of the stream) since the last exchange."""
    poller = select.poll()  # not select.select: a web process with many sockets has fds past 1024
    poller.register(conn.pgconn.socket, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def check_quietly(conn: Any) -> None:
    """psycopg_pool's `check`: raise when `conn` is unusable, with a round trip only when in doubt."""
    if conn.closed:
        raise OperationalError("the connection is closed")
    now = time.monotonic()
    last = getattr(conn, _last_checked_attribute, None)
    quiet = (
        last is not None
        and now - last < QUIET_FOR
        and conn.autocommit
        and conn.info.transaction_status == TransactionStatus.IDLE
        and not _socket_has_news(conn)
    )
    if not quiet:
        ConnectionPool.check_connection(conn)
    # Handed out now: its next request, if it comes within QUIET_FOR, may trust a quiet socket.
    setattr(conn, _last_checked_attribute, now)
