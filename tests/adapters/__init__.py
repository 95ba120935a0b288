"""Pure adapter tests (wire formats, golden bodies): no store, no log, no server. Part of the fast loop."""
