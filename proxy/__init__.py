"""projectionist's I/O shell: the aiohttp app, upstream relay, stores, log, admin API, CLI.

Proxy layer: everything that touches a socket, a file or a database lives here; decisions are
delegated to ``policy/`` and wire shapes to ``adapters/``.
"""
