"""Issue #49: a journal saved on the lab after real operations is read by `opsctl validate
--from-file` as an operator would read it. The lab host's own journal of the service across a
deploy (ar-tp8 -> ddtree), a rollback and a tune (its trial release and the restore), saved as text
(`journalctl -u UNIT`) and as `journalctl -o json --all`: every start is a clean start, nothing is
called a restart; then one real crash (the lab's `crash_after` fault, systemd's Restart=on-failure
brings the server back): exactly one restart. A `-o json` file saved without `--all` (journald
writes long fields as null) is refused with the fix in the message.

With OPSCTL_SAVE_JOURNALS=DIR the journals are also copied to DIR (how
tests/validate/data/lab_journals/ was made; test_saved_journals.py reads those files)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]
UNIT = "sglang-k26"
GENERATE = ("python3 -c \"import json, urllib.request as u; r = u.Request('http://127.0.0.1:30000/generate', "
            "json.dumps({'input_ids': list(range(1000, 1016)), 'sampling_params': {'max_new_tokens': 8, 'temperature': 0}}).encode(), "
            "{'Content-Type': 'application/json'}); print(u.urlopen(r, timeout=30).status)\" 2>/dev/null || echo 0")
HEALTH = ("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/health_generate', "
          "timeout=5).status)\" 2>/dev/null || echo 0")


def _opsctl(*args: str, inv: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*OPSCTL, *args, "-i", str(inv)], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def _validate(path: Path, *args: str) -> tuple[int, dict, str]:
    p = subprocess.run([*OPSCTL, "validate", "--from-file", str(path), *args, "--json"], capture_output=True,
                       text=True, cwd=REPO, timeout=120)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    return p.returncode, (json.loads(lines[-1]) if lines else {}), p.stderr


def _wait(lab, cmd: str, want: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.run(cmd, check=False).stdout.strip() == want:
            return True
        time.sleep(0.5)
    return False


def _save(lab, since: str, dest: Path, name: str) -> dict[str, Path]:
    """The service's journal since `since`, as an operator saves it: text, -o json --all, -o json."""
    out = {}
    for kind, flags, ext in (("text", "", "journal.txt"), ("json-all", "-o json --all", "journal.json-all"),
                             ("json", "-o json", "journal.json")):
        text = lab.run(f"journalctl -u {UNIT} --since @{since} --no-pager {flags}", check=True, timeout=60).stdout
        path = dest / f"{name}.{ext}"
        path.write_text(text)
        out[kind] = path
    keep = os.environ.get("OPSCTL_SAVE_JOURNALS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for path in out.values():
            shutil.copy(path, Path(keep) / path.name)
    return out


def _restarts(doc: dict) -> list[dict]:
    return [f for f in doc.get("findings", []) if f["check"].endswith("startup.restarts")]


@pytest.fixture(scope="module")
def journals(baselined, lab_host, tmp_path_factory):
    """Deploy, rollback and tune on the baselined host, then one crash; the journals saved after
    the clean operations and after the crash."""
    lab = lab_host
    lab.clear_faults()
    baselined.restore(lab)
    inv = lab_host.inventory_dir  # the gate at the lab's levels (1, 4, 8): budget 16 passes there
    dest = tmp_path_factory.mktemp("journals")
    time.sleep(1.1)  # --since has a one-second resolution: the restored start is before the window
    since = lab.run("date +%s", check=True).stdout.strip()
    p = _opsctl("deploy", "ddtree", "--budget", "16", "--yes", "--skip-checks", inv=inv)
    assert p.returncode == 0, p.stdout + p.stderr
    p = _opsctl("rollback", inv=inv)
    assert p.returncode == 0, p.stdout + p.stderr
    p = _opsctl("tune", "ddtree", "--budgets", "4", "--concurrency", "1", "--yes", "--out",
                str(dest / "tune"), inv=inv, timeout=1200)
    assert p.returncode == 0, p.stdout + p.stderr
    clean = _save(lab, since, dest, "deploy-rollback-tune")
    # one real crash: the scheduler dies after 3 requests, systemd starts it again (Restart=on-failure)
    lab.set_fault("crash_after", requests=3)
    try:
        lab.run(f"systemctl restart {UNIT}", check=True, timeout=120)  # the fault is read at start
        assert _wait(lab, HEALTH, "200", 120)
        for _ in range(6):
            if lab.run(GENERATE, check=False).stdout.strip() != "200":
                break
        assert _wait(lab, f"systemctl show -p NRestarts --value {UNIT}", "1", 60)
    finally:
        lab.clear_faults()  # before systemd's restart (RestartSec): the restarted server is healthy
    assert _wait(lab, HEALTH, "200", 180)
    crash = _save(lab, since, dest, "deploy-rollback-tune-crash")
    yield clean, crash
    baselined.restore(lab)


@pytest.mark.parametrize("kind", ["text", "json-all"])
def test_clean_starts_are_not_restarts(journals, kind):
    clean, _ = journals
    rc, doc, err = _validate(clean[kind], "--start", "all")
    assert doc.get("starts", 0) >= 5, (doc.get("starts"), err)  # deploy, rollback, tune trial, restore
    restarts = _restarts(doc)
    # start 1 is the baseline's server being stopped (the window opens after its start): not validated
    assert len(restarts) >= doc["starts"] - 1 and all(f["ok"] for f in restarts), restarts
    assert rc == 0, (err, [f for f in doc.get("findings", []) if not f["ok"]])
    rc, doc, err = _validate(clean[kind])  # the last start alone, the default
    assert rc == 0 and len(_restarts(doc)) == 1, err


@pytest.mark.parametrize("kind", ["text", "json-all"])
def test_one_real_crash_is_exactly_one_restart(journals, kind):
    _, crash = journals
    rc, doc, err = _validate(crash[kind], "--start", "all")
    restarts = _restarts(doc)
    failed = [f for f in restarts if not f["ok"]]
    assert len(failed) == 1 and "restarted 1 time(s)" in failed[0]["diagnosis"], restarts
    assert rc == 6, err
    rc, doc, err = _validate(crash[kind])
    (last,) = _restarts(doc)
    assert not last["ok"] and "restarted 1 time(s)" in last["diagnosis"], last


def test_json_without_all_is_refused_with_the_fix(journals):
    clean, _ = journals
    rc, doc, err = _validate(clean["json"])
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert "--all" in lines[0] and "null" in lines[0], lines[0]
