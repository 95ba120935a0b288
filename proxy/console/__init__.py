"""The console (proxy layer): the admin API (``admin``) and the session inspector (``ui``), on the
admin listener only."""
