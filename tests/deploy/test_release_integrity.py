"""Issue #32 item 9: a release's runtime tree (releases/<id>/site/...), its rendered files and
its drafter are checked by FULL content hashes in `check post` and before a rollback switches
(sampled hashes only when the operator asks for speed); a deploy finds an edited staged
release and stages it again; a `--verify-weights` repair is reported as a repair (never
`unchanged`) and restarts the server that loaded the bad weights."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import pytest

from hostdirs import (current, drafter, host_config, install_programs, make_current, read_ledger, release, sha,
                      write_ledger)
from opsctl.artifacts import SAMPLE, sampled_sha256
from opsctl.errors import CheckFailed
from opsctl.flow import deploy, promote
from opsctl.flow.steps import Steps
from opsctl.host.connection import LocalConnection
from opsctl.integrity import Integrity, site_files, verify_release
from opsctl.releases import HostState, ReleaseInfo

SITE = {"sglang_ddtree/__init__.py": b"", "sglang_ddtree/tree.py": b"def build():\n    return 1\n",
        "sglang_ddtree-0.1.0.dist-info/METADATA": b"Name: sglang-ddtree\n"}
BIG = 3 * SAMPLE + 4096   # a drafter shard with bytes outside the three 1 MiB samples


def _shard() -> bytes:
    return bytes(range(256)) * (BIG // 256) + b"\0" * (BIG % 256)


@pytest.fixture
def host_root(tmp_path):
    root = tmp_path / "root"
    dm = drafter(root, {"config.json": b'{"block_size": 8}', "model.safetensors": _shard()})
    # the sampled hashes a deploy records beside the drafter's manifest (sync_drafter)
    mpath = root / "shared/drafters" / dm.digest / "manifest.json"
    mpath.write_text(dm.to_json({rel: sampled_sha256(root / "shared/drafters" / dm.digest / rel) for rel in dm.files}))
    release(root, "ar-tp8-base")
    release(root, "ddtree-b16-good", "ddtree", kind="ddtree", budget=16, site=SITE, drafter_manifest=dm)
    make_current(root, "ar-tp8-base")
    host = host_config(tmp_path, root)
    return SimpleNamespace(root=root, host=host, drafter=dm, ddir=root / "shared/drafters" / dm.digest,
                           rel=root / "releases/ddtree-b16-good")


def _check(h, rid="ddtree-b16-good", **kw) -> Integrity:
    return verify_release(LocalConnection(), h.host, rid, **kw)


# --------------------------------------------------------------------------- what is checked


def test_a_clean_release_passes_every_check(host_root):
    rep = _check(host_root)
    assert rep.ok, rep.problems
    assert rep.site == {"how": "manifest", "files": 3} and rep.drafter["how"] == "full" and rep.rendered == 3
    assert "3 runtime file(s)" in rep.checked() and "(full sha256)" in rep.checked()
    assert _check(host_root, "ar-tp8-base").ok   # no runtime, no drafter: an empty site/ and its rendered files


def test_an_edit_to_the_runtime_tree_is_found(host_root):
    (host_root.rel / "site/sglang_ddtree/tree.py").write_text("def build():\n    return 2\n")
    rep = _check(host_root)
    assert not rep.ok and rep.problems[0].startswith("site/sglang_ddtree/tree.py: sha256")


def test_a_file_added_to_the_runtime_tree_is_found_bytecode_is_not(host_root):
    (host_root.rel / "site/sglang_ddtree/__pycache__").mkdir()
    (host_root.rel / "site/sglang_ddtree/__pycache__/tree.cpython-311.pyc").write_bytes(b"\x00pyc")
    (host_root.rel / "site/sglang_ddtree-0.1.0.dist-info/INSTALLER").write_text("pip\n")
    assert _check(host_root).ok
    (host_root.rel / "site/sitecustomize.py").write_text("import os\n")
    (host_root.root / "releases/ar-tp8-base/site/sglang").mkdir(parents=True)
    (host_root.root / "releases/ar-tp8-base/site/sglang/__init__.py").write_text("")   # shadows the real one
    assert _check(host_root).problems == ["site/sitecustomize.py: not part of the release's runtime (an added file)"]
    assert "site/sglang/__init__.py: not part of the release's runtime" in _check(host_root, "ar-tp8-base").problems[0]


def test_an_edit_to_a_rendered_file_is_found(host_root):
    with open(host_root.rel / "sglang.env", "a") as f:
        f.write("LD_PRELOAD=/tmp/x.so\n")
    assert _check(host_root).problems[0].startswith("sglang.env: sha256")


def test_a_drafter_byte_outside_the_samples_is_found_by_the_full_check_only(host_root):
    shard = host_root.ddir / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[SAMPLE + 100] ^= 0xFF          # between the start and the middle sample
    shard.write_bytes(bytes(data))
    full = _check(host_root)
    assert full.problems and full.problems[0].startswith("drafter/model.safetensors: sha256")
    assert _check(host_root, drafter="sampled").ok and _check(host_root, drafter="sizes").ok
    data[0] ^= 0xFF                     # inside the first sample
    shard.write_bytes(bytes(data))
    assert _check(host_root, drafter="sampled").problems[0].startswith("drafter/model.safetensors: sampled sha256")


def test_an_edited_drafter_manifest_does_not_hide_an_edited_file(host_root):
    (host_root.ddir / "config.json").write_text('{"block_size": 4}')
    m = json.loads((host_root.ddir / "manifest.json").read_text())
    m["files"]["config.json"] = {"sha256": sha(b'{"block_size": 4}'), "size": 17}
    (host_root.ddir / "manifest.json").write_text(json.dumps(m))
    rep = _check(host_root)
    assert any("lists other files than the release's digest names" in p for p in rep.problems), rep.problems


def test_a_release_planned_before_site_files_is_checked_against_the_wheels_record(host_root):
    man = json.loads((host_root.rel / "manifest.json").read_text())
    man.pop("site_files")
    (host_root.rel / "manifest.json").write_text(json.dumps(man))
    record = "".join(f"{rel},sha256={_b64(body)},{len(body)}\n" for rel, body in SITE.items())
    record += "sglang_ddtree-0.1.0.dist-info/RECORD,,\n"
    (host_root.rel / "site/sglang_ddtree-0.1.0.dist-info/RECORD").write_text(record)
    rep = _check(host_root)
    assert rep.ok and rep.site["how"] == "record", rep.problems
    (host_root.rel / "site/sglang_ddtree/tree.py").write_text("x = 1\n")
    assert _check(host_root).problems[0].startswith("site/sglang_ddtree/tree.py: sha256")


def _b64(body: bytes) -> str:
    import base64
    import hashlib

    return base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()


def test_site_files_are_what_pip_installs_from_the_wheel(tmp_path):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/__init__.py", "X = 1\n")
        zf.writestr("demo/core.py", "def f():\n    return 2\n")
        zf.writestr("demo-1.0.data/purelib/demo_extra.py", "Y = 3\n")
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n")
        zf.writestr("demo-1.0.dist-info/RECORD", "")
    files = site_files(wheel)
    assert set(files) == {"demo/__init__.py", "demo/core.py", "demo_extra.py", "demo-1.0.dist-info/METADATA",
                          "demo-1.0.dist-info/WHEEL"}
    # what pip really puts in the release's site/ passes the host's check against that list
    root = tmp_path / "root"
    release(root, "ddtree-b4-x", "ddtree", kind="ddtree", site={"placeholder": b""})
    rel = root / "releases/ddtree-b4-x"
    (rel / "site/placeholder").unlink()
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                          str(rel / "site"), str(wheel)], capture_output=True, text=True, timeout=300)
    if pip.returncode != 0:
        pytest.skip(f"pip could not install the test wheel here: {pip.stderr.strip()[-200:]}")
    man = json.loads((rel / "manifest.json").read_text())
    man["site_files"] = files
    (rel / "manifest.json").write_text(json.dumps(man))
    host = host_config(tmp_path, root)
    rep = verify_release(LocalConnection(), host, "ddtree-b4-x")
    assert rep.ok, rep.problems


def test_the_inline_check_and_the_installed_program_agree(host_root):
    install_programs(host_root.root, ("opsctl-verify",))
    (host_root.rel / "site/sglang_ddtree/tree.py").write_text("x = 1\n")
    res = subprocess.run([sys.executable, str(host_root.root / "bin/opsctl-verify"), str(host_root.root),
                          "ddtree-b16-good"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and json.loads(res.stdout)["problems"] == _check(host_root).problems


# --------------------------------------------------------------------------- before a rollback switches


def test_a_rollback_to_a_damaged_release_is_refused_before_anything_changes(host_root, monkeypatch):
    write_ledger(host_root.root, {"action": "promote", "result": "ok", "to_release": "ddtree-b16-good"},
                 {"action": "rollback", "result": "ok", "to_release": "ar-tp8-base"})
    (host_root.rel / "site/sglang_ddtree/tree.py").write_text("import os; os.system('id')\n")
    monkeypatch.setattr(promote, "connect", lambda h: LocalConnection())

    def must_not(*a, **k):
        raise AssertionError("nothing may switch")

    monkeypatch.setattr(promote, "switch", must_not)
    before = read_ledger(host_root.root)
    with pytest.raises(CheckFailed) as exc:
        promote.rollback_host(host_root.host, "ddtree-b16-good", "manual", None)
    line = exc.value.one_line()
    assert exc.value.exit_code == 6 and "\n" not in line
    assert "release ddtree-b16-good on lab differs from its manifest: site/sglang_ddtree/tree.py" in line
    assert "nothing was switched" in line and "(fix: redeploy its profile ('opsctl deploy ddtree --budget 16" in line
    assert current(host_root.root) == "ar-tp8-base" and read_ledger(host_root.root) == before


def test_the_automatic_rollback_passes_over_a_damaged_fallback(monkeypatch):
    log: list = []
    monkeypatch.setattr(promote, "switch", lambda conn, host, rel, **kw: log.append(("switch", rel)) or 0)
    monkeypatch.setattr(promote, "disarm_guard", lambda conn, host: None)
    monkeypatch.setattr(promote, "wait_ready", lambda *a, **k: SimpleNamespace(seconds=1.0))
    monkeypatch.setattr(promote, "release_profile", lambda info, host: None)
    monkeypatch.setattr(promote, "append_ledger", lambda conn, host, rec: log.append(("ledger", dict(rec))) or rec)
    monkeypatch.setattr(promote, "check_release_files", lambda conn, host, rel, quick=False: Integrity(
        rel, ["drafter/model.safetensors: sha256 1, the manifest says 2"] if rel == "ddtree-b16-good" else []))
    rels = {r: ReleaseInfo(r, {"profile": {"name": r.rsplit("-", 1)[0]}}) for r in ("ar-tp8-base", "ddtree-b16-good",
                                                                                       "ddtree-b8-new")}
    state = HostState("ddtree-b8-new", rels, [{"action": "promote", "result": "ok", "to_release": "ddtree-b16-good"}])
    plan = SimpleNamespace(release="ddtree-b8-new", profile=SimpleNamespace(name="ddtree", budget=8), state=state)
    host = SimpleNamespace(name="lab", baseline_profile="ar-tp8")
    out = promote.roll_back_after_failure(object(), host, plan, ["ddtree-b16-good", "ar-tp8-base"], "gate failed",
                                          None, Steps(None, "lab"))
    assert [x for x in log if x[0] == "switch"] == [("switch", "ar-tp8-base")]
    ledger = [x[1] for x in log if x[0] == "ledger"]
    assert ledger[0]["result"] == "failed" and ledger[0]["switched"] is False and "model.safetensors" in ledger[0]["error"]
    assert ledger[1]["result"] == "ok" and "rolled back to ar-tp8-base" in out


# --------------------------------------------------------------------------- check post


def test_check_post_hashes_the_live_runtime_tree(host_root):
    from opsctl.checks import test_post
    from opsctl.releases import read_state

    make_current(host_root.root, "ddtree-b16-good")

    class Probe:
        def state(self):
            return read_state(LocalConnection(), host_root.host)

        def run(self, command, timeout=None):
            r = LocalConnection().run(command, check=False)
            return SimpleNamespace(rc=r.rc, stdout=r.stdout, stderr=r.stderr)

    said: list[str] = []
    test_post.test_release_files_checksums(host_root.host, Probe(), said.append)
    assert "3 runtime file(s)" in said[0]
    (host_root.rel / "site/sglang_ddtree/tree.py").write_text("x = 1\n")
    with pytest.raises(AssertionError, match="differs from its manifest: site/sglang_ddtree/tree.py"):
        test_post.test_release_files_checksums(host_root.host, Probe(), said.append)


def test_the_post_check_is_in_the_catalog():
    from opsctl.checks import catalog

    assert "release_files_checksums" in catalog.names("post")


# --------------------------------------------------------------------------- deploy: repair, restage


def _apply_live(monkeypatch, repairs: list[str]):
    calls: list = []
    monkeypatch.setattr(deploy, "append_ledger", lambda c, h, rec: calls.append(("ledger", rec)) or rec)
    monkeypatch.setattr(deploy, "arm_guard", lambda *a, **k: calls.append(("arm",)))
    monkeypatch.setattr(deploy, "switch", lambda c, h, rel, **kw: calls.append(("switch", rel)) or 0)
    monkeypatch.setattr(deploy, "wait_ready", lambda *a, **k: SimpleNamespace(seconds=2.0))
    monkeypatch.setattr(deploy, "disarm_guard", lambda c, h: calls.append(("disarm",)))
    monkeypatch.setattr(deploy, "prune", lambda c, h: [])
    monkeypatch.setattr(deploy, "require_room", lambda *a, **k: None)
    monkeypatch.setattr(deploy, "fallback_releases", lambda state, host, exclude: ["ar-tp8-base"])
    profile = SimpleNamespace(name="ddtree", budget=16, readiness_timeout_s=60)
    plan = SimpleNamespace(release="ddtree-b16-good", previous="ddtree-b16-good", is_live=True, repairs=repairs,
                           state=SimpleNamespace(judged=lambda r: True), profile=profile, as_dict=lambda: {},
                           triton_outcome=None)
    host = SimpleNamespace(name="lab", settings=SimpleNamespace(guard_s=None))
    out = deploy._apply(object(), None, host, profile, plan, Steps(None, "lab"), False,
                        staged=(SimpleNamespace(changed=0), SimpleNamespace(bytes_sent=4096)), checks=False)
    return out, calls


def test_a_verify_weights_repair_of_the_live_release_restarts_it_and_says_repaired(monkeypatch):
    out, calls = _apply_live(monkeypatch, ["drafter/model.safetensors"])
    assert out.result == "repaired" and out.details["repaired"] == ["drafter/model.safetensors"]
    assert ("switch", "ddtree-b16-good") in calls      # the restart: the server had loaded the bad weights
    records = [c[1] for c in calls if c[0] == "ledger"]
    assert [r["result"] for r in records] == ["started", "ok"] and records[-1]["action"] == "promote"
    assert records[-1]["repaired"] == ["drafter/model.safetensors"] and records[0]["repairs"]


def test_without_repairs_a_judged_live_release_is_still_unchanged(monkeypatch):
    out, calls = _apply_live(monkeypatch, [])
    assert out.result == "unchanged" and not any(c[0] == "switch" for c in calls)


def test_a_deploy_finds_an_edited_staged_release_and_stages_it_again(tmp_path, monkeypatch):
    from opsctl.flow.plan import make_plan
    from opsctl.flow.stage import _release_vars

    root = tmp_path / "root"
    host = host_config(tmp_path, root)
    env = root / "shared/envs/sglang-0.5.23"
    env.mkdir(parents=True)
    (env / ".opsctl-complete").touch()
    conn = LocalConnection()
    profile = host.profile("ar-tp8")
    first = make_plan(conn, host, profile)
    assert not first.release_exists and first.restage == []
    rel = root / "releases" / first.release
    (rel / "site").mkdir(parents=True)
    for name, text in first.rendered.release_files.items():
        (rel / name).write_text(text)
    manifest = {**first.manifest(), "created_at": "2026-11-01T00:00:00Z"}
    (rel / "manifest.json").write_text(json.dumps(manifest))
    again = make_plan(conn, host, profile)
    assert again.release == first.release and again.release_exists and again.restage == []
    (rel / "site/sglang").mkdir()
    (rel / "site/sglang/__init__.py").write_text("raise SystemExit\n")   # an edit to the staged runtime tree
    damaged = make_plan(conn, host, profile)
    assert damaged.restage == ["site/sglang/__init__.py: not part of the release's runtime (an added file)"]
    assert any("differs from its manifest" in c and "stage it again" in c for c in damaged.changes)
    assert damaged.repairs == damaged.restage
    v = _release_vars(damaged, "")
    assert v["opsctl_restage"] is True
    staged_manifest = json.loads(next(__import__("base64").b64decode(f["content_b64"]) for f in
                                      v["opsctl_release_files"] if f["path"] == "manifest.json"))
    assert staged_manifest["created_at"] == "2026-11-01T00:00:00Z"   # its place among the releases is kept


def test_the_playbook_replaces_a_damaged_release():
    from hostdirs import REPO

    play = (REPO / "playbooks/prepare.yml").read_text()
    assert "opsctl_restage" in play and ".damaged-" in play
