"""What the proxy knows of a wire format, as data: the facts each adapter declares (adapters layer, pure).

An adapter module declares, near its top:

- ``FACTS``, a ``FormatFacts``: the upstream format it speaks and what the proxy does by that
  format (its default upstream, the hints routing reads, tracing's provider name, its WebSocket
  routes, its Files API, whether its paths sit under ``/v1``, whether its upstream signs
  requests). Every adapter of one format holds the same object: the format's first adapter in
  the registry declares it, the others name it.
- ``CALLS``, a ``CallFacts``: what is read off one of its calls (tracing's operation name, the
  paths that count tokens rather than generate, the model a path names).

and ``sign(method, url, headers, body, credential)``: the headers to set on a request to its
upstream (replacing the client's auth headers) for the configured credential; ``body`` is None
for a body streamed through unread. It is pure: all it needs comes as arguments. The proxy finds
all of these through ``registry``, never by a format's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Spoken:
    """How a request that names no upstream (no ``/u/{name}/``) shows the format it speaks, so
    it goes to the default upstream of that name: any one of these. Formats are asked in the
    registry's order, the one that says ``otherwise`` last."""

    #: Request headers (lowercase names) only this format's clients send.
    headers: tuple[str, ...] = ()
    #: Query parameters only its clients send.
    query: tuple[str, ...] = ()
    #: Paths that are its own, whole, and the prefixes of paths that are.
    paths: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    #: A pattern its paths match whole.
    pattern: re.Pattern[str] | None = None
    #: The format of every request no other format claims (exactly one format says so).
    otherwise: bool = False


@dataclass(frozen=True, slots=True)
class Socket:
    """A route of the format's upstream that serves a WebSocket: the path it takes (whole) and
    the kind of socket, one the relay knows: ``responses`` (each ``response.create`` a projected
    call) or ``realtime`` (relayed unchanged)."""

    path: re.Pattern[str]
    kind: Literal["responses", "realtime"]


@dataclass(frozen=True, slots=True)
class Files:
    """The Files API the format's SDKs upload to, whose image uploads the proxy admits as
    attachments: ``multipart`` (``POST /v1/files``; the shapes are its speaking adapter's
    ``file_object``) or ``resumable`` (Gemini's upload protocol)."""

    kind: Literal["multipart", "resumable"]
    #: The ``purpose`` a multipart upload must name to be admitted ('': any image is).
    purpose: str = ""
    #: Whether ``GET /v1/files`` lists the upstream's files, then the attachments.
    lists: bool = False


@dataclass(frozen=True, slots=True)
class FormatFacts:
    """One upstream format, as the proxy acts on it."""

    #: The format's name: an upstream's ``format`` in the config, and its default upstream's name.
    name: str
    #: The base URL of its default upstream ('': it has none; an upstream of it is configured).
    url: str = ""
    #: How a request without ``/u/{name}/`` shows it speaks this format (None: it never does).
    spoken: Spoken | None = None
    #: ``gen_ai.provider.name`` (and ``gen_ai.system``) of its calls' spans ('': ``name``).
    provider: str = ""
    #: The routes of its upstream that serve a WebSocket.
    sockets: tuple[Socket, ...] = ()
    #: Its Files API, when the proxy answers one for it.
    files: Files | None = None
    #: Its clients' paths start with ``/v1`` (their SDKs' base URLs end in it, or add it): a 404
    #: to one of its projected paths without ``/v1`` is a base URL one ``/v1`` off.
    v1_paths: bool = False
    #: False: ``sign`` reads the credential alone; it is asked once per call, as the outgoing
    #: headers are built (method and URL '' there, the client's headers, body None), and its
    #: headers take the place of the client's. True: it reads the request (method, URL, headers,
    #: body), so it is asked right before each send, re-sends and replays too, on the bytes that
    #: go (never on a WebSocket: such a format declares no ``sockets``).
    signs_request: bool = False


@dataclass(frozen=True, slots=True)
class CallFacts:
    """What is read off one adapter's calls."""

    #: ``gen_ai.operation.name`` of its calls (None: they have none, as a batch).
    operation: str | None = None
    #: Endings of its paths that count tokens rather than generate: those calls have no operation.
    counting: tuple[str, ...] = ()
    #: Where a path names the model (its first group, percent-encoded), for a format whose body does not.
    model_path: re.Pattern[str] | None = None
