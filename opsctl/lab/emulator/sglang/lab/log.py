"""SGLang's log format: `[%Y-%m-%d %H:%M:%S<prefix>] message` on stdout (journald adds its own prefix)."""
from __future__ import annotations

import os
import sys
import time


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


def log(msg: str, rank: str = "") -> None:
    prefix = f" {rank}" if rank else ""
    sys.stdout.write(f"[{stamp()}{prefix}] {msg}\n")
    sys.stdout.flush()


def fatal_traceback(frames, last: str, *, rank: str = "", prefix: str = "", sigquit: bool = False,
                    exit_code: int = 1) -> None:
    """Print a Python traceback the way SGLang's processes die, then exit."""
    lines = [f"{prefix}Traceback (most recent call last):"]
    for path, lineno, func, code in frames:
        lines.append(f'  File "/opt/opsctl/shared/envs/sglang-0.5.23/lib/python3.11/site-packages/{path}", '
                     f"line {lineno}, in {func}")
        lines.append(f"    {code}")
    lines.extend(last.rstrip("\n").split("\n"))
    if prefix or rank:
        log(lines[0], rank)
        sys.stdout.write("\n".join(lines[1:]) + "\n")
    else:
        sys.stdout.write("\n".join(lines) + "\n")
    if sigquit:
        log("Received sigquit from a child process. It usually means the child failed.")
    sys.stdout.flush()
    sys.stderr.flush()
    from sglang.lab import gpu

    gpu.unregister(os.getpid())
    os._exit(exit_code)
