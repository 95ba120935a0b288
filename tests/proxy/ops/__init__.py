"""The ops layer: the command line, the demo, replay from the command line."""
