"""Tests of the proxy's I/O layers, one folder per layer of ``proxy/``."""
