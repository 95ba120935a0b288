"""projectionist: an LLM provider proxy that keeps sessions alive when an image can no longer be read.

The one import name of the project. Its parts are the design card's top-level folders, linked in
here: ``projectionist.policy`` (pure domain), ``projectionist.adapters`` (wire formats) and
``projectionist.proxy`` (all I/O).
"""
