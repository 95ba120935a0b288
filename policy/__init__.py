"""projectionist's pure domain: references, events, the quarantine fold, projection, recovery.

Policy layer: no aiohttp, no provider formats, no I/O of its own. Storage is reached only through
the ``AttachmentStore`` and ``SessionLog`` Protocols of ``policy.ports``.
"""
