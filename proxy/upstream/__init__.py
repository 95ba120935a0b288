"""The upstream leg (proxy layer): the ``Transport`` seam and its two transports (the built-in
client, the aiohttp reference), each upstream's target and URLs; and, until they join ``call``,
the projection step's body preparation (``prepare``, ``scan``, ``describe``, ``identity``)."""
