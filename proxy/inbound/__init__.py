"""What every handler stands on (proxy layer): the request's context and its error rendering,
the app's services, client and admin auth, request bodies, numbers a client writes, and the state
calls of one process share."""
