"""A real MCP server (the official Python SDK's low-level `Server`) over stdio.

Usage: mcp_server.py [VERSION]
VERSION is the `serverInfo.version` it reports ("dev-build" when not given,
which is not semver). Its tools:

- `echo {text}`: answers `{"text": text}` as structured content.
- `fail {reason}`: answers an `isError: true` result whose text is `reason`.
- `refuse {reason, repeat}`: answers a JSON-RPC error (invalid params) whose
  message is `reason` `repeat` times (once when not given), as a server that
  rejects the call outright does.
- `add_tool {notify}`: from now on lists `late` too; with `notify` true
  (the default) it sends `notifications/tools/list_changed` before answering.
- `late {n}`: listed only after `add_tool`; answers `{"doubled": 2 * n}`
  (numbers arrive as floats from a protobuf Struct).
"""

import sys

import anyio
import mcp_types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.shared.exceptions import MCPError
from mcp.server.stdio import stdio_server


def obj(properties: dict, required: list) -> dict:
    schema = {"type": "object", "properties": properties}
    return schema | ({"required": required} if required else {})


ALWAYS = [
    types.Tool(
        name="echo",
        description="Echoes its text",
        input_schema=obj({"text": {"type": "string"}}, ["text"]),
    ),
    types.Tool(
        name="fail",
        description="Always an isError result",
        input_schema=obj({"reason": {"type": "string"}}, ["reason"]),
    ),
    types.Tool(
        name="refuse",
        description="Always a JSON-RPC error",
        input_schema=obj({"reason": {"type": "string"}, "repeat": {"type": "number"}}, ["reason"]),
    ),
    types.Tool(
        name="add_tool",
        description="Lists `late` from now on",
        input_schema=obj({"notify": {"type": "boolean"}}, []),
    ),
]
LATE = types.Tool(
    name="late",
    description="Listed only after add_tool",
    input_schema=obj({"n": {"type": "number", "minimum": 0}}, ["n"]),
)

# One process per session (stdio): the state of this one client.
state = {"late": False}


def text(s: str, is_error: bool = False, structured: dict | None = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=s)], structured_content=structured, is_error=is_error
    )


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=ALWAYS + ([LATE] if state["late"] else []))


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "echo":
        return text(args["text"], structured={"text": args["text"]})
    if params.name == "fail":
        return text(args["reason"], is_error=True)
    if params.name == "refuse":
        raise MCPError(code=types.INVALID_PARAMS, message=args["reason"] * int(args.get("repeat", 1)))
    if params.name == "add_tool":
        state["late"] = True
        if args.get("notify", True):
            await ctx.session.send_tool_list_changed()
        return text("added", structured={"added": "late", "notified": args.get("notify", True)})
    if params.name == "late" and state["late"]:
        return text("doubled", structured={"doubled": 2 * args["n"]})
    return text(f"unknown tool {params.name}", is_error=True)


async def main(version: str) -> None:
    server = Server("py-probe", version=version, on_list_tools=list_tools, on_call_tool=call_tool)
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))
    async with stdio_server() as (read, write):
        await server.run(read, write, options)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "dev-build")
