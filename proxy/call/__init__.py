"""The proxied call's home (proxy layer): one ``Call`` (``call``), built by the edge, runs its
stages in order (``pipeline``): read (``read``, ``sessions``), prepare (``project``, over the body's
preparation: ``prepare``, ``scan``, ``describe``), send (``send`` over ``relay`` and
``outgoing``), record (``record``); re-sent once when the upstream refuses an image (``resend``),
replayed from its record through the same transport (``replay``)."""
