"""The observe layer: metrics and the overhead header."""
