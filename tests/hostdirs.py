"""A host's install root in a tmp directory, for unit tests of what happens on the host:
releases with manifests, the `current` link, the ledger, the drafter store and the host
programs (playbooks/files), driven through `LocalConnection` or run as subprocesses."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from opsctl.artifacts import DrafterManifest
from opsctl.config import HostConfig, load_inventory

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = ("opsctl-switch", "opsctl-ledger-append", "opsctl-guard", "opsctl-verify")


def host_config(tmp_path: Path, root: Path, extra: str = "", *, port: int = 30000) -> HostConfig:
    """The lab inventory's host 'lab' with its install root at ROOT, this Python as the host's."""
    inv = tmp_path / "inv"
    if inv.exists():
        shutil.rmtree(inv)
    shutil.copytree(REPO / "inventories/lab", inv)
    gv = inv / "group_vars/all.yml"
    text = gv.read_text().replace("install_root: /opt/opsctl", f"install_root: {root}")
    text = text.replace("host_python: /usr/bin/python3", f"host_python: {sys.executable}")
    text = text.replace("http_port: 30000", f"http_port: {port}")
    gv.write_text(text + extra)
    return load_inventory(inv).hosts["lab"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def drafter(root: Path, files: dict[str, bytes]) -> DrafterManifest:
    """A drafter in <root>/shared/drafters/<digest>, as a deploy leaves it."""
    m = DrafterManifest({rel: {"sha256": sha(b), "size": len(b)} for rel, b in files.items()})
    d = root / "shared" / "drafters" / m.digest
    for rel, b in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(b)
    (d / "manifest.json").write_text(m.to_json())
    return m


def release(root: Path, rid: str, profile: str = "ar-tp8", *, kind: str = "autoregressive", budget: int | None = None,
            created: str = "2026-12-01T10:00:00Z", site: dict[str, bytes] | None = None,
            drafter_manifest: DrafterManifest | None = None, readiness_timeout_s: int = 120) -> dict:
    """A staged release: rendered files, site/ (the runtime tree), drafter link, manifest."""
    d = root / "releases" / rid
    d.mkdir(parents=True)
    rendered = {"sglang-k26.service": f"[Service]\nExecStart=/bin/true {rid}\n".encode(),
                "sglang.env": b"PYTHONPATH=/opt/opsctl/current/site\n", "launch.json": b"{}\n"}
    for name, body in rendered.items():
        (d / name).write_bytes(body)
    (d / "site").mkdir()
    for rel, body in (site or {}).items():
        (d / "site" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "site" / rel).write_bytes(body)
    if drafter_manifest is not None:
        os.symlink(f"../../shared/drafters/{drafter_manifest.digest}", d / "drafter")
    manifest = {"id": rid, "profile": {"name": profile, "kind": kind, "budget": budget,
                                       "readiness_timeout_s": readiness_timeout_s},
                "files": {n: sha(b) for n, b in rendered.items()},
                "runtime_wheel": {"name": "sglang_ddtree-0.1.0-py3-none-any.whl", "sha256": "0" * 64} if site else None,
                "site_files": {rel: sha(b) for rel, b in site.items()} if site else None,
                "drafter": ({"digest": drafter_manifest.digest, "bytes": drafter_manifest.total_bytes}
                            if drafter_manifest else None),
                "created_at": created}
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def make_current(root: Path, rid: str) -> None:
    link = root / "current"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(f"releases/{rid}", link)


def current(root: Path) -> str:
    return os.readlink(root / "current").split("/")[-1]


def write_ledger(root: Path, *records: dict) -> None:
    with open(root / "ledger.jsonl", "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def read_ledger(root: Path) -> list[dict]:
    path = root / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def install_programs(root: Path, names: tuple[str, ...] = PROGRAMS) -> Path:
    """The host programs in <root>/bin, as the prepare playbook installs them."""
    b = root / "bin"
    b.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(REPO / "playbooks/files" / name, b / name)
        (b / name).chmod(0o755)
    return b
