"""aiohttp's client errors as the transport's, by one table (proxy layer, upstream sublayer).

The aiohttp reference transport (``aiohttp_transport``) and the WebSocket legs (``websocket``) both
map at their boundary through ``mapped``, so nothing above them knows aiohttp's client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import aiohttp

from .transport import (
    ClientError, ConnectError, ConnectTimeout, PayloadError, PoolTimeout, ReadTimeout, ResponseError,
    ServerDisconnected,
)

#: aiohttp's client exceptions and the transport's error each becomes, most specific first (the
#: first entry the exception is an instance of wins). Anything else (cancellation, a bug) passes.
AIOHTTP_ERRORS: Final[tuple[tuple[type[BaseException], type[Exception]], ...]] = (
    (aiohttp.ConnectionTimeoutError, ConnectTimeout),
    (aiohttp.SocketTimeoutError, ReadTimeout),
    (aiohttp.ServerTimeoutError, ReadTimeout),
    (aiohttp.ClientConnectorError, ConnectError),
    (aiohttp.ServerDisconnectedError, ServerDisconnected),
    (aiohttp.ClientPayloadError, PayloadError),
    (aiohttp.ClientResponseError, ResponseError),  # a malformed answer (aiohttp's parser)
    (aiohttp.InvalidURL, ConnectError),
    (aiohttp.ClientOSError, ConnectError),
    (aiohttp.ClientConnectionError, PayloadError),
    (aiohttp.ClientError, ClientError),
)


@contextmanager
def mapped(pool_wait: bool = False) -> Iterator[None]:
    """aiohttp's errors inside become the transport's (``AIOHTTP_ERRORS``); a timeout while
    ``pool_wait`` (no connection was free) is a ``PoolTimeout``."""
    try:
        yield
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if isinstance(exc, asyncio.TimeoutError) and not isinstance(exc, aiohttp.ClientError):
            raise (PoolTimeout if pool_wait else ReadTimeout)(str(exc) or type(exc).__name__) from exc
        for foreign, ours in AIOHTTP_ERRORS:
            if isinstance(exc, foreign):
                raise ours(str(exc) or type(exc).__name__) from exc
        raise  # unreachable: aiohttp.ClientError is the last entry
