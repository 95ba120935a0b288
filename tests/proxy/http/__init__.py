"""The HTTP layer: app, middleware, routes and handlers, through a proxy on a test server."""
