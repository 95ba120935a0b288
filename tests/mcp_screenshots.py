"""A minimal MCP server on stdio with one tool, ``screenshot``, as browser MCP servers have one: each
call returns a new 2400 x 1400 PNG (its colour the call's number) as an image content block, which
the agent passes on in a ``tool_result``, unresized. Run by the agent itself (``--mcp-config``):
``python tests/mcp_screenshots.py [WIDTH HEIGHT]``. Newline-delimited JSON-RPC 2.0, the protocol's
stdio transport: ``initialize``, ``tools/list``, ``tools/call`` and ``ping``."""

from __future__ import annotations

import base64
import io
import json
import sys
from typing import Any

from PIL import Image


def screenshot(n: int, width: int, height: int) -> str:
    img = Image.new("RGB", (width, height), ((37 * n) % 256, (91 * n + 7) % 256, 200))
    out = io.BytesIO()
    img.save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def answer(request: dict[str, Any], calls: list[int], width: int, height: int) -> dict[str, Any] | None:
    method, params = request.get("method"), request.get("params") or {}
    if "id" not in request:
        return None  # a notification
    if method == "initialize":
        result: dict[str, Any] = {"protocolVersion": params.get("protocolVersion", "2024-11-05"),
                                  "capabilities": {"tools": {}}, "serverInfo": {"name": "shots", "version": "1.0"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "screenshot", "description": "Take a screenshot of the page",
                             "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call":
        calls.append(len(calls))
        result = {"content": [{"type": "image", "data": screenshot(calls[-1], width, height),
                               "mimeType": "image/png"}]}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def main() -> None:
    width, height = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) == 3 else (2400, 1400)
    calls: list[int] = []
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line), calls, width, height)
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
