"""projectionist: an LLM provider proxy that keeps sessions alive when an image can no longer be read.

The one import name of the project is this checkout: its design-card folders are the package's
parts, ``projectionist.policy`` (pure domain), ``projectionist.adapters`` (wire formats) and
``projectionist.proxy`` (all I/O). pyproject maps the package to this folder and ships only those
three; ``tests/``, ``bench/`` and ``config/`` stay out of the wheel.
"""
