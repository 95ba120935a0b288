"""The proxied call's home (proxy layer): a routed request read (``pipeline``, ``sessions``),
prepared (``upstream.prepare``: the projection), sent (``send``, ``outgoing``), recorded
(``record``), re-sent once when the upstream refuses an image (``resend``), and replayed from its
record (``replay``)."""
