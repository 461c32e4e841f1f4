"""A tiny MCP server on stdio, written with the official `mcp` SDK (PyPI), that the mcp-bridge
end-to-end tests (tests/e2e/plugins_mcp.rs) have the gateway spawn per SSE session.

Arguments: PIDFILE [MARK]. The server appends its process id to PIDFILE when it starts, so a
test can check that the gateway ends and reaps it; MARK is returned by the `whoami` tool, so a
test can tell which configured arguments the process got. It reports its environment variable
`MCP_TEST_ENV` through the `env` tool.
"""

import os
import sys

from mcp.server.mcpserver import MCPServer

pidfile = sys.argv[1]
mark = sys.argv[2] if len(sys.argv) > 2 else ""
with open(pidfile, "a") as f:
    f.write(f"{os.getpid()}\n")

server = MCPServer("ferrisix-e2e")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
def whoami() -> str:
    """The mark this process was started with."""
    return mark


@server.tool()
def shout(text: str) -> str:
    """Writes `text` to stderr, then answers it upper-cased."""
    print(text, file=sys.stderr, flush=True)
    return text.upper()


if __name__ == "__main__":
    server.run("stdio")
