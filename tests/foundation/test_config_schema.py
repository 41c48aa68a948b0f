"""`opsctl config schema`: the JSON Schema of an inventory variables file's `opsctl:` mapping, for
editors' YAML language servers (docs/inventory.md). It must accept the inventories the loader
accepts and refuse what the loader refuses (an unknown key, a wrong type)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VARS_FILES = sorted(p for d in ("group_vars", "host_vars") for p in (REPO / "inventories").glob(f"*/{d}/*.yml"))


@pytest.fixture(scope="module")
def schema() -> dict:
    proc = subprocess.run([sys.executable, "-m", "opsctl", "config", "schema"], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    jsonschema.Draft202012Validator.check_schema(data)
    return data


def _errors(schema: dict, doc: dict) -> list[str]:
    return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]


@pytest.mark.parametrize("path", VARS_FILES, ids=lambda p: str(p.relative_to(REPO / "inventories")))
def test_every_inventory_in_the_repo_validates(schema, path):
    doc = yaml.safe_load(path.read_text()) or {}
    assert _errors(schema, doc) == []


def test_an_unknown_key_and_a_wrong_type_are_refused_as_the_loader_refuses_them(schema):
    base = yaml.safe_load((REPO / "inventories" / "lab" / "group_vars" / "all.yml").read_text())
    bad_key = {"opsctl": {**base["opsctl"], "instal_root": "/opt/x"}}
    assert any("instal_root" in m for m in _errors(schema, bad_key))
    nested = {"opsctl": {**base["opsctl"], "watch": {"interval": 5}}}
    assert any("interval" in m for m in _errors(schema, nested))
    wrong = {"opsctl": {**base["opsctl"], "http_port": "thirty thousand"}}
    assert _errors(schema, wrong)
    bad_mode = {"opsctl": {**base["opsctl"], "watch": {"mode": "reboot"}}}
    assert any("reboot" in m for m in _errors(schema, bad_mode))


def test_a_partial_file_validates_and_other_ansible_vars_are_left_alone(schema):
    # a host_vars file holds a few keys of the merged mapping; Ansible's own variables sit beside it
    assert _errors(schema, {"ansible_user": "root", "opsctl": {"guard_s": 600, "metrics": {"textfile": None}}}) == []


def test_schema_out_writes_the_file_and_a_bad_path_is_one_line(tmp_path):
    out = tmp_path / "inventory.schema.json"
    proc = subprocess.run([sys.executable, "-m", "opsctl", "config", "schema", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0 and json.loads(out.read_text())["properties"]["opsctl"]["type"] == "object"
    bad = subprocess.run([sys.executable, "-m", "opsctl", "config", "schema", "--out", str(tmp_path / "no" / "x.json")],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) <= 2 and "--out" in bad.stderr
