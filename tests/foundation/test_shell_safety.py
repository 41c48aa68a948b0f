"""Issue #32 item 10: no inventory value or release id can run code on the host.

Every inventory field that reaches a shell command on the host is held to a strict
pattern when the inventory loads (a hostile value is a one-line error, exit 2), and the
release id (built from the profile name, or read back from the host) is shlex-quoted
where it is built into a command."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pytest
import yaml

from opsctl.config import load_inventory
from opsctl.errors import ConfigError
from opsctl.host.connection import LocalConnection

REPO = Path(__file__).resolve().parents[2]

HOSTILE_NAMES = ["arx$(touch${IFS}PWNED)", "a;touch PWNED", "a b", "`touch PWNED`", "a'b", "a\"b", "a\nb",
                 "a|b", "a&b", "a>b", "-rf", "../up", "a*"]
HOSTILE_PATHS = ["/opt/x$(touch${IFS}PWNED)", "/opt/a;touch PWNED", "/opt/a b", "/opt/`id`", "relative/path",
                 "/opt/a'b", "/opt/../etc", "/opt/a\nb", "/opt/*", "~/x"]

# (opsctl.<dotted key>, hostile values): every inventory value that is built into a host command
FIELDS = [
    ("install_root", HOSTILE_PATHS),
    ("host_python", HOSTILE_PATHS),
    ("model.path", HOSTILE_PATHS),
    ("model.name", HOSTILE_NAMES),
    ("service_name", HOSTILE_NAMES + ["x.service"]),
    ("service_user", HOSTILE_NAMES),
    ("bind_address", HOSTILE_NAMES[:10]),
    ("baseline_profile", HOSTILE_NAMES),
]


@pytest.fixture
def inv_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "inv"
    shutil.copytree(REPO / "inventories/blackwell", dst)
    return dst


def _set(inv: Path, dotted: str, value) -> None:
    gv = inv / "group_vars/all.yml"
    data = yaml.safe_load(gv.read_text())
    node = data["opsctl"]
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    gv.write_text(yaml.safe_dump(data))


def test_the_shipped_inventories_still_load():
    for name in ("blackwell", "lab", "lab-fleet"):
        load_inventory(REPO / "inventories" / name)


@pytest.mark.parametrize("dotted,values", FIELDS, ids=[f for f, _ in FIELDS])
def test_hostile_inventory_values_are_refused_at_load(inv_copy: Path, dotted: str, values: list[str]):
    for value in values:
        _set(inv_copy, dotted, value)
        with pytest.raises(ConfigError) as err:
            load_inventory(inv_copy)
        assert dotted.split(".")[-1] in err.value.problem, (value, err.value.problem)


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_profile_names_are_refused_at_load(inv_copy: Path, name: str):
    _set(inv_copy, "profiles", {name: {"kind": "autoregressive", "tp_size": 8}})
    with pytest.raises(ConfigError):
        load_inventory(inv_copy)


def test_hostile_profile_name_is_a_one_line_error_exit_2(inv_copy: Path, tmp_path: Path):
    _set(inv_copy, "profiles", {"arx$(touch${IFS}PWNED)": {"kind": "autoregressive", "tp_size": 8}})
    proc = subprocess.run([sys.executable, "-m", "opsctl", "render", "ar-tp8", "-i", str(inv_copy)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not a safe profile name" in lines[0], proc.stderr
    assert not (tmp_path / "PWNED").exists()


def test_safe_values_still_load(inv_copy: Path):
    _set(inv_copy, "install_root", "/srv/opsctl-2.x/root")
    _set(inv_copy, "model.name", "moonshotai/Kimi-K2.6")
    _set(inv_copy, "service_user", "sglang")
    _set(inv_copy, "bind_address", "::")
    _set(inv_copy, "profiles", {"ddtree-fast.v2": {"kind": "ddtree", "block_size": 8}})
    host = load_inventory(inv_copy).single()
    assert str(host.install_root) == "/srv/opsctl-2.x/root" and host.model.name == "moonshotai/Kimi-K2.6"


# --------------------------------------------------------------------------- quoting of release ids

HOSTILE_RELEASE = "arx$(touch${IFS}PWNED)-0123456789"


def _host_at(root: Path):
    host = load_inventory(REPO / "inventories/blackwell").single()
    return host.model_copy(update={"settings": host.settings.model_copy(update={"install_root": PurePosixPath(root)})})


class _Recording(LocalConnection):
    """A LocalConnection (bash on this machine) that keeps every command it ran."""

    def __init__(self):
        super().__init__("recording")
        self.commands: list[str] = []

    def run(self, command, **kw):
        self.commands.append(command)
        return super().run(command, **kw)


def test_store_release_bench_quotes_the_release(tmp_path: Path, monkeypatch):
    from opsctl.gate import results
    from opsctl.flow.judge import store_release_bench

    root = tmp_path / "root"
    (root / "releases" / HOSTILE_RELEASE).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)

    def fake_write(run, path):
        Path(path).write_text('{"record": "meta"}\n')
        return Path(path)

    monkeypatch.setattr(results, "write_jsonl", fake_write)
    conn = _Recording()
    store_release_bench(conn, _host_at(root), HOSTILE_RELEASE, object())
    assert not list(tmp_path.rglob("PWNED")), conn.commands
    assert (root / "releases" / HOSTILE_RELEASE / "bench.jsonl").read_text() == '{"record": "meta"}\n'


def test_interrupted_before_switch_quotes_the_release(tmp_path: Path, monkeypatch):
    from opsctl.brake import Interrupted
    from opsctl.flow import deploy

    root = tmp_path / "root"
    (root / "releases" / HOSTILE_RELEASE).mkdir(parents=True)
    (root / "releases" / HOSTILE_RELEASE / "manifest.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    ledger: list[dict] = []
    monkeypatch.setattr(deploy, "append_ledger", lambda conn, host, rec: ledger.append(rec) or rec)
    plan = SimpleNamespace(release=HOSTILE_RELEASE, previous=None, profile=SimpleNamespace(name="ar-tp8", budget=None))
    steps = SimpleNamespace(current="stage")
    conn = _Recording()
    out = deploy._interrupted_before_switch(conn, _host_at(root), plan, steps, Interrupted("interrupted"))
    assert not list(tmp_path.rglob("PWNED")), conn.commands
    assert ledger[0]["left_staged"] == [f"release {HOSTILE_RELEASE} (complete, not live)"], out
