"""The WebSocket relay (``proxy/call/websocket.py``): against a real aiohttp WebSocket fake upstream."""
