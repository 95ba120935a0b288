"""The inbound side: the aiohttp application, its middleware, routing and the routes the proxy
answers itself (uploads, the Files API, admin) (proxy layer)."""
