"""A real MCP client (the official Python SDK) against our MCP endpoint.

Usage: mcp_client.py URL KEY TEAM CALLS_JSON
TEAM may be "" (no x-team-id). CALLS_JSON is [[tool, arguments], ...].
Prints one JSON object: the server's name, the tools listed, and each
call's result (or the protocol error it raised).
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url: str, key: str, team: str, calls: list) -> dict:
    headers = {"authorization": f"Bearer {key}", "x-trace-id": "python-mcp-client"}
    if team:
        headers["x-team-id"] = team
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                info = await session.initialize()
                listed = await session.list_tools()
                out = {
                    "server": info.server_info.name,
                    "tools": sorted(t.name for t in listed.tools),
                    "schemas": {t.name: t.input_schema for t in listed.tools},
                    "calls": [],
                }
                for name, arguments in calls:
                    try:
                        r = await session.call_tool(name, arguments)
                        out["calls"].append(
                            {
                                "is_error": r.is_error,
                                "structured": r.structured_content,
                                "text": [c.text for c in r.content if c.type == "text"],
                            }
                        )
                    except Exception as e:  # a protocol error: the refusal
                        out["calls"].append({"protocol_error": str(e)})
                return out


if __name__ == "__main__":
    url, key, team, calls = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    print(json.dumps(asyncio.run(main(url, key, team, calls))))
