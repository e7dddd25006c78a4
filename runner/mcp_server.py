"""`cko mcp`: the operations as Model Context Protocol tools over stdio.

Tools come from the catalogue (runner/catalogue.py), one per command, named with '_' for spaces
("champion_select"). A command with a request schema takes the request itself as the `request`
argument (its relative paths resolve against `request_dir`, default the server's working
directory); every option is an argument of its own. A call runs `python -m cko_perf CMD --json` as a
subprocess (the same code path as the CLI, so the JSON contract and exit codes are the CLI's) and
returns its document as structured content; `is_error` is set when the exit code is not 0.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

SKIP_OPTIONS = frozenset({"as_json", "store", "request"})


def tool_name(command: str) -> str:
    return command.replace(" ", "_").replace("-", "_")


def _property(opt: dict[str, Any]) -> dict[str, Any]:
    prop: dict[str, Any] = {"type": opt["type"]}
    if opt.get("is_flag"):
        prop = {"type": "boolean"}
    if opt.get("choices"):
        prop["enum"] = opt["choices"]
    if opt.get("help"):
        prop["description"] = opt["help"]
    if opt.get("multiple") or opt.get("nargs", 1) == -1:
        prop = {"type": "array", "items": prop}
    return prop


def input_schema(entry: dict[str, Any]) -> dict[str, Any]:
    """The tool's arguments: the request (by its schema), request_dir, store and every option."""
    from .schemas import schema

    props: dict[str, Any] = {
        "store": {"type": "string", "description": "store directory (default: the server's)"}
    }
    required = []
    if entry["request_schema"]:
        req = schema(entry["request_schema"])
        props["request"] = {k: v for k, v in req.items() if k not in ("$id",)}
        props["request_dir"] = {
            "type": "string",
            "description": "directory the request's relative paths "
            "resolve against (default: the server's working directory)",
        }
        required.append("request")
    for opt in entry["options"]:
        if opt["name"] in SKIP_OPTIONS:
            continue
        props[opt["name"]] = _property(opt)
        if opt["required"]:
            required.append(opt["name"])
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def argv_for(
    entry: dict[str, Any], args: dict[str, Any], store: str
) -> tuple[list[str], str | None, str | None]:
    """(argv, stdin text, cwd) for one tool call."""
    argv = entry["name"].split() + ["--json", "--store", str(args.get("store") or store)]
    positional: list[str] = []
    for opt in entry["options"]:
        name = opt["name"]
        if name in SKIP_OPTIONS or args.get(name) is None:
            continue
        value = args[name]
        values = value if isinstance(value, list) else [value]
        if opt["kind"] == "argument":
            positional += [str(v) for v in values]
        elif opt.get("is_flag"):
            argv += [opt["flags"][0]] if value else []
        else:
            for v in values:
                argv += [opt["flags"][0], str(v)]
    stdin = None
    if entry["request_schema"]:
        argv += ["--request", "-"]
        stdin = json.dumps(args.get("request") or {})
    if positional:
        argv += (["--"] if entry["name"] == "exec" else []) + positional
    return argv, stdin, args.get("request_dir")


def serve(store: Path) -> None:
    try:
        import anyio
        import mcp_types as types
        from mcp.server.lowlevel import Server
        from mcp.server.stdio import stdio_server
    except ImportError as exc:
        from .errors import unavailable

        raise unavailable(
            f"cko mcp needs the mcp package: pip install 'cko-perf[mcp]' ({exc})", code="missing_mcp"
        ) from None
    from .catalogue import NOT_TOOLS, catalogue

    entries = {tool_name(e["name"]): e for e in catalogue() if e["name"] not in NOT_TOOLS}
    tools = [
        types.Tool(name=n, description=f"{e['summary']}\n\n{e['help']}", input_schema=input_schema(e))
        for n, e in entries.items()
    ]

    from .images import lock_path

    lock = lock_path()

    async def on_list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        entry = entries.get(params.name)
        if entry is None:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"unknown tool {params.name}")], is_error=True
            )
        argv, stdin, cwd = argv_for(entry, dict(params.arguments or {}), str(store.absolute()))
        # A call runs where its request lives, but with the image lock the server found from its own
        # working directory: the request's directory need not be inside the project.
        env = {**os.environ, "CKO_IMAGES_LOCK": os.environ.get("CKO_IMAGES_LOCK") or str(lock)}
        proc = await anyio.run_process(
            [sys.executable, "-m", "cko_perf", *argv],
            input=(stdin or "").encode(),
            cwd=cwd,
            check=False,
            env=env,
        )
        text = proc.stdout.decode(errors="replace")
        try:
            doc = json.loads(text)
        except ValueError:
            doc = {
                "ok": False,
                "error": "internal",
                "message": "no JSON document on stdout",
                "stderr": proc.stderr.decode(errors="replace")[-2000:],
                "exit_code": proc.returncode,
            }
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(doc, sort_keys=True))],
            structured_content=doc,
            is_error=proc.returncode != 0,
        )

    server = Server("cko", on_list_tools=on_list_tools, on_call_tool=on_call_tool)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
