"""Drives ferrisix's mcp-bridge as an MCP client would, with the official `mcp` SDK's SSE
client (PyPI): connects to the SSE endpoint given as the first argument, initializes, lists the
tools, calls some, and prints one JSON object with what it got for the test
(tests/e2e/plugins_mcp.rs) to check. With a second SSE URL, a second client works at the same
time on its own session, as APISIX's own test of the plugin does.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.sse import sse_client


async def one(url, a, b):
    async with sse_client(url) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            # First: the stderr line it writes comes as a notification in no set order with
            # the answer, and must not arrive after the session is closed (the SDK's reader
            # fails on a message for a closed session).
            shout = await session.call_tool("shout", {"text": 'say "hi"'})
            tools = await session.list_tools()
            added = await session.call_tool("add", {"a": a, "b": b})
            who = await session.call_tool("whoami", {})
            return {
                "server": init.server_info.name,
                "tools": sorted(t.name for t in tools.tools),
                "add": added.content[0].text,
                "whoami": who.content[0].text,
                "shout": shout.content[0].text,
            }


async def main():
    urls = sys.argv[1:]
    results = await asyncio.gather(*(one(u, 2 + i, 40) for i, u in enumerate(urls)))
    print(json.dumps(results))


asyncio.run(main())
