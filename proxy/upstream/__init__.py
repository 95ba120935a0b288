"""The upstream leg (proxy layer): the ``Transport`` seam and its two transports (the built-in
client, the aiohttp reference), each upstream's target and URLs, and the identity of images
clients inline (``identity``: the sha256 of their bytes, kept for the app's life)."""
