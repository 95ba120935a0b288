"""Wire-format adapters: one small data mapper per provider format (adapters layer).

Each module finds reference sites in a decoded body, renders a projection back into that
provider's shapes, shapes error bodies the way that provider's SDK parses them and names its auth
headers. No policy, no I/O, no placeholder wording: those live in ``policy/`` and ``proxy/``.
"""
