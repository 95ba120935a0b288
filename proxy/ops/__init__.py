"""Operating projectionist: the command line and the keyless demo (proxy layer)."""
