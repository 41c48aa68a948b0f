#!/usr/bin/env python3
"""Start-up cost of the opsctl CLI: what every `opsctl ...` pays before it does anything.

For each command line below it runs `python -m opsctl ARGS` as a subprocess N times (after one
discarded warm-up run) and prints the median wall time and the median CPU time (user + sys of
the child), plus the `-X importtime` cumulative milliseconds of `import opsctl.cli` (median of
N). The end-to-end tests call the CLI this way several hundred times.

Every command line runs offline: --help; a command that fails on bad input before any host I/O
(a missing inventory, an unknown profile) after importing what it runs; or one that reads local
files only (validate --from-file, render). No lab and no host needed.

    .venv/bin/python benchmarks/cli_startup.py [--runs 5] [--against REV] [--json]

--against REV measures the opsctl package of git revision REV as well (`git archive` into a
temporary directory) and prints both side by side, e.g. `--against HEAD~1`.

The children run at idle priority (SCHED_IDLE) unless --no-idle: on a loaded machine the wall
times wander, the CPU column is the one to compare. They may write and read __pycache__ (as an
ordinary run does; the directories are git-ignored) even where PYTHONDONTWRITEBYTECODE is set
here; --no-bytecode measures runs that compile every opsctl source each time instead.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_INVENTORY = "/nonexistent/opsctl-inventory"  # the command imports what it runs, then stops at load_inventory

# (label, argv after `opsctl`, expected exit code)
COMMANDS: list[tuple[str, list[str], int]] = [
    ("--help", ["--help"], 0),
    ("deploy --help", ["deploy", "--help"], 0),
    ("rollback --help", ["rollback", "--help"], 0),
    ("status --help", ["status", "--help"], 0),
    ("history --help", ["history", "--help"], 0),
    ("lab --help", ["lab", "--help"], 0),
    ("deploy (bad profile, exit 2)", ["deploy", "no-such-profile", "-i", "inventories/lab", "--yes"], 2),
    ("rollback (no inventory, exit 2)", ["rollback", "-i", NO_INVENTORY, "--json"], 2),
    ("status --json (no inventory, exit 2)", ["status", "-i", NO_INVENTORY, "--json"], 2),
    ("history (no inventory, exit 2)", ["history", "-i", NO_INVENTORY], 2),
    ("watch status (no inventory, exit 2)", ["watch", "status", "-i", NO_INVENTORY], 2),
    ("tune ar-tp8 (refused, exit 2)", ["tune", "ar-tp8", "-i", "inventories/lab", "--yes"], 2),
    ("validate --from-file", ["validate", "--from-file", "tests/validate/data/ddtree_b16_healthy.journal.txt",
                              "--profile", "ddtree", "--budget", "16"], 0),
    ("render ddtree --json", ["render", "ddtree", "--budget", "16", "-i", "inventories/lab", "--json"], 0),
]


class Runner:
    def __init__(self, python: str, tree: Path, *, idle: bool, bytecode: bool):
        self.python, self.tree, self.idle, self.bytecode = python, tree, idle, bytecode

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("OPSCTL_INVENTORY", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
        env["PYTHONPATH"] = str(self.tree)
        env["COLUMNS"] = "100"
        if not self.bytecode:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def _run(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        # -P: the working directory (this checkout, for the command lines' relative paths) stays off
        # sys.path, so PYTHONPATH names the package measured
        return subprocess.run([self.python, "-P", *args], cwd=REPO, env=self._env(),
                              preexec_fn=_idle if self.idle else None, **kw)

    def once(self, argv: list[str]) -> tuple[float, float, int]:
        """(wall s, CPU s of the child, exit code)"""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = self._run(["-m", "opsctl", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), p.returncode

    def import_ms(self) -> float:
        """-X importtime's cumulative microseconds of opsctl.cli, in ms."""
        p = self._run(["-X", "importtime", "-c", "import opsctl.cli"], capture_output=True, text=True)
        for line in p.stderr.splitlines():
            m = re.match(r"import time:\s*\d+ \|\s*(\d+) \| opsctl\.cli$", line)
            if m:
                return int(m.group(1)) / 1000
        raise SystemExit(f"no opsctl.cli line in -X importtime's output:\n{p.stderr[-2000:]}")

    def measure(self, runs: int) -> dict:
        if not self.bytecode:  # opsctl's own byte code only: the venv's packages keep theirs, as pip installed them
            for d in (self.tree / "opsctl").rglob("__pycache__"):
                shutil.rmtree(d)
        self.import_ms()  # warm-up
        imp = [self.import_ms() for _ in range(runs)]
        rows = []
        for label, argv, want in COMMANDS:
            self.once(argv)  # warm-up: byte-code caches, page cache
            walls, cpus = [], []
            for _ in range(runs):
                wall, cpu, rc = self.once(argv)
                if rc != want:
                    raise SystemExit(f"{self.tree}: opsctl {' '.join(argv)}: exit {rc}, expected {want}")
                walls.append(wall)
                cpus.append(cpu)
            rows.append({"command": label, "argv": argv, "wall_s": statistics.median(walls),
                         "cpu_s": statistics.median(cpus)})
        return {"tree": str(self.tree), "runs": runs, "bytecode": self.bytecode,
                "import_opsctl_cli_ms": statistics.median(imp), "import_opsctl_cli_ms_all": imp, "commands": rows}


def _idle() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def export(rev: str, into: Path) -> Path:
    """The package (and the templates render reads beside it) of git revision `rev`, under `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "opsctl", "templates", "playbooks"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def print_table(results: list[tuple[str, dict]]) -> None:
    imp_label = "import opsctl.cli, ms (-X importtime)"
    width = max(len(imp_label), *(len(label) for label, _, _ in COMMANDS))
    first = results[0][1]
    print(f"opsctl CLI start-up, median of {first['runs']} runs, seconds"
          + ("" if first["bytecode"] else " (no byte-code cache: every opsctl source compiled each run)"))
    head = "".join(f"  {'wall ' + name:>14}  {'cpu ' + name:>13}" for name, _ in results)
    print(f"{'command':<{width}}{head}")
    for i, (label, _, _) in enumerate(COMMANDS):
        cells = "".join(f"  {r['commands'][i]['wall_s']:14.3f}  {r['commands'][i]['cpu_s']:13.3f}" for _, r in results)
        print(f"{label:<{width}}{cells}")
    cells = "".join(f"  {r['import_opsctl_cli_ms']:14.0f}  {'':13}" for _, r in results)
    print(f"{imp_label:<{width}}{cells}")
    for name, r in results:
        print(f"  {name}: {r['tree']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--against", metavar="REV", help="also measure the opsctl of this git revision")
    ap.add_argument("--no-idle", action="store_true", help="run the children at normal priority")
    ap.add_argument("--no-bytecode", action="store_true", help="compile opsctl's sources on every run, as a "
                    "process with PYTHONDONTWRITEBYTECODE=1 and no __pycache__ does")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    kw = {"idle": not args.no_idle, "bytecode": not args.no_bytecode}

    with tempfile.TemporaryDirectory(prefix="opsctl-startup-") as tmp:
        results = []
        if args.against:
            results.append((args.against, Runner(args.python, export(args.against, Path(tmp)), **kw).measure(args.runs)))
        results.append(("now", Runner(args.python, REPO, **kw).measure(args.runs)))
    if args.json:
        print(json.dumps(dict(results), indent=1))
    else:
        print_table(results)


if __name__ == "__main__":
    main()
