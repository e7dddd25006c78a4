"""`run`: probe the container, check the GPU grant, then exec the requested command.

Exit 97 (and .cko/gpu-check.json) when the GPUs visible inside are not exactly those granted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..probe import check_granted, probe

GPU_MISMATCH_EXIT = 97


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="operations run")
    ap.add_argument("--meta", required=True, help="directory for the probe and checks")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    if not cmd:
        print("operations run: no command", file=sys.stderr)
        return 2
    os.makedirs(args.meta, exist_ok=True)
    info = probe()
    with open(os.path.join(args.meta, "probe.json"), "w") as f:
        json.dump(info, f, sort_keys=True)
    granted = [u for u in os.environ.get("CKO_GRANTED_GPUS", "").split(",") if u]
    reason = check_granted(granted, info["gpus"].get("uuids", []))
    if reason:
        with open(os.path.join(args.meta, "gpu-check.json"), "w") as f:
            json.dump(
                {"ok": False, "reason": reason, "granted": granted, "seen": info["gpus"].get("uuids")}, f
            )
        print(f"cko: {reason}", file=sys.stderr)
        return GPU_MISMATCH_EXIT
    sys.stdout.flush()
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"cko: cannot execute {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached
