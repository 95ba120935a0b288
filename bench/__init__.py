"""Benchmark harness for projectionist (not part of the installed package).

``python -m bench`` starts a fake upstream, a bare aiohttp proxy, projectionist and (when present)
LiteLLM as separate processes, loads each with the same bodies side by side, and prints absolute
figures plus the ratios the project's performance targets are stated in. See ``bench/README.md``.
"""
