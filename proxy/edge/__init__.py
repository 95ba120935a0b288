"""The edge (proxy layer): the aiohttp applications, the one middleware, routing, readiness. It
hands a routed request down (``call``, ``files``, ``console``) and gets a response back."""
