"""What `opsctl ...` imports before it does anything (benchmarks/cli_startup.py measures the time).

The end-to-end tests start the CLI hundreds of times: `import opsctl.cli` loads typer and the
command groups only, and each command imports the core it runs inside its function. A group
module that imports its core at the top again (or a core module that pulls a heavy one for a
rare path) fails here, naming the module. Behaviour, not timing: these lists do not wander with
the machine's load."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# the core, and the third-party packages only the core (or one command) needs. Not pydantic: typer
# (>= 0.29) coerces a command's option values with pydantic, so only `opsctl --help` and
# `opsctl --version` go without it.
CORE = ["opsctl.config", "opsctl.flow", "opsctl.tune", "opsctl.watch", "opsctl.wheelhouse", "opsctl.triton",
        "opsctl.gate", "opsctl.render", "opsctl.journal", "opsctl.journal_findings", "opsctl.findings",
        "opsctl.host", "opsctl.releases", "opsctl.lab", "opsctl.checks", "opsctl.onhost", "opsctl.report",
        "opsctl.buildwheel", "opsctl.artifacts", "opsctl.startup", "opsctl.drain", "opsctl.trialset", "opsctl.diagnose",
        "yaml", "jinja2", "packaging", "httpx", "fabric", "paramiko", "ansible_runner", "matplotlib"]
# the core the deploy flow does not need on every deploy: a ddtree release's Triton cache, the
# wheelhouse of a host without its base environment, the HTTP client of the host-side watch
NOT_IN_A_DEPLOY = ["opsctl.triton", "opsctl.wheelhouse", "packaging", "urllib.request", "http.client", "ssl",
                   "opsctl.tune", "opsctl.lab", "matplotlib"]

_SCRIPT = """
import contextlib, io, json, sys
sys.argv = ["opsctl", *json.loads(sys.argv[1])]
import_only = sys.argv[1:] == ["--import-only"]
if import_only:
    import opsctl.cli
else:
    from opsctl.cli import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code
    if code not in (0, None):
        raise SystemExit(f"exit {code}: {err.getvalue()}")
print(json.dumps(sorted(sys.modules)))
"""


def modules_after(*args: str) -> set[str]:
    """The modules loaded by running `opsctl ARGS` in a fresh interpreter (its output swallowed);
    `--import-only`: by `import opsctl.cli` alone."""
    env = {k: v for k, v in os.environ.items() if k != "OPSCTL_INVENTORY"}
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(list(args))], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return set(json.loads(p.stdout.splitlines()[-1]))


def loaded(modules: set[str], names: list[str]) -> list[str]:
    """Which of `names` (a package stands for its submodules) are among `modules`."""
    return sorted(n for n in names if any(m == n or m.startswith(n + ".") for m in modules))


def test_importing_the_cli_loads_no_core_no_pydantic_and_no_rich():
    mods = modules_after("--import-only")
    assert "opsctl.cli.deploy" in mods and "opsctl.cli.lab" in mods  # every command group is registered
    assert loaded(mods, CORE + ["pydantic", "rich"]) == []


@pytest.mark.parametrize("args", [["--help"], ["--version"]])
def test_the_top_level_help_loads_no_core_no_pydantic_and_no_rich(args):
    assert loaded(modules_after(*args), CORE + ["pydantic", "rich"]) == []


@pytest.mark.parametrize("args", [
    ["deploy", "--help"],
    ["rollback", "--help"],
    ["status", "--help"],
    ["history", "--help"],
    ["tune", "--help"],
    ["validate", "--help"],
    ["diagnose", "--help"],
    ["bench", "--help"],
    ["lab", "--help"],
    ["watch", "status", "--help"],
    ["wheelhouse", "build", "--help"],
])
def test_a_commands_help_loads_no_core(args):
    assert loaded(modules_after(*args), CORE + ["rich"]) == []


def test_render_loads_the_renderer_and_no_flow():
    mods = modules_after("render", "ddtree", "--budget", "16", "-i", "inventories/lab", "--json")
    assert "opsctl.render" in mods and "jinja2" in mods
    assert loaded(mods, ["opsctl.flow", "opsctl.gate.results", "opsctl.gate.measure", "rich", *NOT_IN_A_DEPLOY]) == []


def test_validate_from_a_file_loads_the_parsers_and_no_flow():
    mods = modules_after("validate", "--from-file", "tests/validate/data/ddtree_b16_healthy.journal.txt",
                         "--profile", "ddtree", "--budget", "16", "--json")
    assert "opsctl.journal_findings" in mods
    assert loaded(mods, ["opsctl.flow", "opsctl.render", "jinja2", "opsctl.host.facts", "rich",
                         *NOT_IN_A_DEPLOY]) == []


@pytest.mark.parametrize("module,absent", [
    # deploy: the whole flow, but not what only a ddtree release or a bare host needs
    ("opsctl.flow.deploy", NOT_IN_A_DEPLOY),
    # rollback: no planner, no renderer, no load generator; the journal's findings on a failed start only
    ("opsctl.flow.promote", ["opsctl.flow.plan", "opsctl.flow.stage", "opsctl.render", "jinja2", "opsctl.gate.measure",
                             "opsctl.gate.results", "opsctl.journal_findings", *NOT_IN_A_DEPLOY]),
    # status and history: the ledger, the service and the watch; no journal parser
    ("opsctl.flow.inspect", ["opsctl.flow.deploy", "opsctl.flow.plan", "opsctl.flow.promote", "opsctl.render",
                             "jinja2", "opsctl.gate.measure", "opsctl.gate.results", "opsctl.journal",
                             *NOT_IN_A_DEPLOY]),
    # watch status / pause / resume
    ("opsctl.watch", ["opsctl.flow", "opsctl.gate.results", "opsctl.journal", *NOT_IN_A_DEPLOY]),
])
def test_a_command_loads_only_the_core_it_runs(module, absent):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert loaded(set(json.loads(p.stdout)), absent) == []
