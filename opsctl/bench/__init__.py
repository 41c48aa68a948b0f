"""Benchmarks: the load generator (`loadgen.py`, stdlib-only, copied to and run
on the host), results in bench_serving's field names, and the greedy canary.

The deploy runs the load on the host (the default, to keep the network out of
the numbers):

    conn.put(LOADGEN_PATH, "/tmp/opsctl-loadgen.py")
    res = conn.run(loadgen_command(policy, url="http://127.0.0.1:30000"), timeout=...)
    run = results.parse_loadgen_output(res.stdout, meta={...})
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

LOADGEN_PATH = Path(__file__).with_name("loadgen.py")


def loadgen_command(policy: Any, *, url: str, remote_path: str = "/tmp/opsctl-loadgen.py", python: str = "python3",
                    make_canary: bool = False, canary_file: str | None = None, quiet: bool = False) -> str:
    """The shell command that runs the copied loadgen.py on the host with a
    `GatePolicy`'s bench (JSON lines on stdout, progress on stderr)."""
    argv = [python, remote_path, "--url", url, *policy.loadgen_args(make_canary=make_canary, canary_file=canary_file),
            "--json"]
    if quiet:
        argv.append("--quiet")
    return shlex.join(argv)
