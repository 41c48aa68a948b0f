"""End to end on the lab host: the host checks after a good deploy, and one broken thing
at a time (each breaks the named check and no other; state is restored after each case).

One deploy (dflash, so the release has drafter weights) serves the whole module; the lab
boots once per session (tests/conftest.py's lab_host).
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import pytest

from opsctl.checks.runner import CheckReport, run_checks
from opsctl.config import load_inventory

pytestmark = pytest.mark.lab

PROFILE = "dflash"
# checks that need the server up: they fail together when the service is stopped
SERVING = {"unit_active", "port_listening", "health_generate"}


def failing(report: CheckReport) -> set[str]:
    return {r.check for r in report.results if not r.ok}


def explain(report: CheckReport) -> str:
    rows = "\n".join(f"  {r.outcome:7} {r.group}.{r.check}: {r.message}" for r in report.results)
    return f"{report.summary()}\n{rows}\n--- pytest output ---\n{report.output[-3000:]}"


def only_fails(report: CheckReport, *names: str) -> None:
    assert failing(report) == set(names), explain(report)


def wait_ok(inv, group: str = "all", timeout: float = 90) -> CheckReport:
    deadline = time.monotonic() + timeout
    while True:
        report = run_checks(inv, group)
        if report.ok or time.monotonic() > deadline:
            return report
        print(f"waiting for the checks to pass: {report.summary()}")
        time.sleep(1)


@pytest.fixture(scope="module")
def inv(lab_host):
    from opsctl.flow.deploy import deploy

    t0 = time.monotonic()
    lab_host.clear_faults()
    inventory = load_inventory(lab_host.inventory_dir)
    # the real flow: deploy runs the pre checks before touching the host and the post checks
    # on the new release before promoting it (gates off: no bench baseline needed)
    outcomes = deploy(inventory, PROFILE, None, gates=False, pre_checks=True)
    assert outcomes[0].result in ("promoted", "unchanged"), outcomes[0].as_dict()
    if outcomes[0].result == "promoted":
        assert outcomes[0].details.get("post_checks", {}).get("ok") is True, outcomes[0].as_dict()
    print(f"release live after {time.monotonic() - t0:.1f}s")
    report = wait_ok(inventory, "post")
    assert report.ok, explain(report)
    return inventory


@pytest.fixture
def lab(lab_host, inv):
    """The lab with a good deploy; every case must leave pre and post passing again."""
    yield lab_host
    lab_host.clear_faults()
    report = wait_ok(inv, "all")
    assert report.ok, "case did not restore the host: " + explain(report)


def sh(lab_host, command: str, stdin: str | None = None) -> str:
    proc = lab_host.run(command, stdin=stdin, timeout=60)
    assert proc.returncode == 0, f"{command!r} failed: {proc.stderr or proc.stdout}"
    return proc.stdout


def start_service(lab_host, unit: str, port: int = 30000) -> None:
    """systemctl start, once the port has no server-side TIME_WAIT sockets left (a safety net: a server
    binding without SO_REUSEADDR, as the emulator once did, fails to bind right after a stop)."""
    deadline = time.monotonic() + 75
    while time.monotonic() < deadline:
        if not sh(lab_host, f"ss -Htan state time-wait '( sport = :{port} )'").strip():
            break
        time.sleep(1)
    sh(lab_host, f"systemctl start {unit}")


def test_good_deploy_passes_pre_and_post(lab, inv):
    report = run_checks(inv, "all")
    assert report.ok, explain(report)
    names = {r.check for r in report.results}
    assert {"ssh_reachable", "gpu_count", "service_port", "unit_file_matches_render", "drafter_checksums",
            "health_generate", "journal_ready"} <= names
    # with our own service running, its GPU processes, memory and port are not held against the host
    assert "our service" in report.result("service_port").message, explain(report)
    # the emulator holds ~73 GB per GPU: only counting it out leaves >= min_free_mib free
    assert "held by our service not counted" in report.result("gpu_free_memory").message, explain(report)
    assert "sglang-k26.service" in report.result("gpu_no_leftover_processes").message, explain(report)
    assert report.result("drafter_checksums").outcome == "passed"
    assert all(r.host == "lab" for r in report.results)


def test_cli_and_plain_pytest_on_good_host(lab, inv):
    """The documented ways in: `opsctl check --json`, and plain pytest on the packaged suite."""
    proc = subprocess.run([sys.executable, "-m", "opsctl", "check", "post", "-i", str(inv.path), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] and data["counts"]["failed"] == 0 and data["hosts"] == ["lab"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "opsctl.checks.plugin",
                           "--pyargs", "opsctl.checks", "--inventory", str(inv.path), "-q"],
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "23 passed" in proc.stdout, proc.stdout[-2000:]   # 11 pre, 12 post (release_files_checksums: #32; ddtree_serves_what_the_release_means: #50)


def test_unit_file_edited_on_host_is_drift(lab, inv):
    unit = inv.hosts["lab"].unit_name
    path = f"/etc/systemd/system/{unit}"
    original = sh(lab, f"cat {path}")
    assert "RestartSec=30" in original
    try:
        # an operator "fixes" the unit in place (through the link, as an editor does)
        sh(lab, f"sed -i --follow-symlinks -e 's/^RestartSec=30$/RestartSec=5/' -e '$a Nice=-5' {path}")
        report = run_checks(inv, "post")
        # the unit in /etc links into the release, so the edit is both drift from the render and a
        # release file that no longer matches its manifest: two findings, one cause, both named
        only_fails(report, "unit_file_matches_render", "release_files_checksums")
        msg = report.result("unit_file_matches_render").message
        assert "expected 'RestartSec=30', found 'RestartSec=5'" in msg and "unexpected 'Nice=-5'" in msg, msg
        assert "NeedDaemonReload=yes" in msg, msg
        assert unit in report.result("release_files_checksums").message
    finally:
        sh(lab, f"cat > $(readlink -f {path})", stdin=original)


def test_truncated_weights_fail_checksums(lab, inv):
    host = inv.hosts["lab"]
    ddir = sh(lab, f"readlink -f {host.install_root}/current/drafter").strip()
    victim = sh(lab, f"cd {ddir} && ls *.safetensors | head -1").strip()
    assert victim
    backup = f"/root/.opsctl-checks-{victim}.bak"
    sh(lab, f"cp -p {ddir}/{victim} {backup}")
    try:
        sh(lab, f"truncate -s 1000 {ddir}/{victim}")
        report = run_checks(inv, "post")
        only_fails(report, "drafter_checksums")
        msg = report.result("drafter_checksums").message
        assert f"{victim}: 1000 bytes" in msg, msg
    finally:
        sh(lab, f"cat {backup} > {ddir}/{victim} && rm -f {backup}")


def test_a_file_added_to_the_live_releases_runtime_tree_fails_its_checksums(lab, inv):
    """Issue #32 item 9 — WRITTEN WITHOUT BEING RUN: a module dropped into the live release's site/
    (it runs with the server) is found by a full check of the release's files, and only that check fails."""
    host = inv.hosts["lab"]
    rel = sh(lab, f"readlink -f {host.install_root}/current").strip()
    try:
        sh(lab, f"printf 'import os\\n' > {rel}/site/sitecustomize.py")
        report = run_checks(inv, "post")
        only_fails(report, "release_files_checksums")
        msg = report.result("release_files_checksums").message
        assert "site/sitecustomize.py: not part of the release's runtime" in msg, msg
        sh(lab, f"rm -f {rel}/site/sitecustomize.py && echo '# edited' >> {rel}/sglang.env")
        only_fails(run_checks(inv, "post"), "release_files_checksums")
    finally:
        sh(lab, f"rm -f {rel}/site/sitecustomize.py; sed -i '/^# edited$/d' {rel}/sglang.env")


def test_leftover_gpu_process(lab, inv):
    # a small leftover, so that free memory stays above min_free_mib: only the named check fails
    fault = lab.set_fault("gpu_leftover", memory_mib=1000)
    report = run_checks(inv, "pre")
    only_fails(report, "gpu_no_leftover_processes")
    msg = report.result("gpu_no_leftover_processes").message
    assert f"PID {fault['pid']}" in msg and "not owned by sglang-k26.service" in msg, msg
    lab.clear_faults()
    assert run_checks(inv, "pre").ok


def test_too_little_disk(lab, inv):
    root = str(inv.hosts["lab"].install_root)
    sh(lab, f"mount -t tmpfs -o size=16m opsctl-checks-small {shlex.quote(root)}")
    try:
        report = run_checks(inv, "pre")
        only_fails(report, "disk_space")
        msg = report.result("disk_space").message
        assert f"on {root}" in msg and "need 1 GiB" in msg, msg
    finally:
        sh(lab, f"umount {shlex.quote(root)}")
    assert "opsctl-checks-small" not in sh(lab, "cat /proc/mounts")


def test_failing_pre_check_blocks_deploy_and_changes_nothing(lab, inv):
    from opsctl.flow.deploy import deploy
    from opsctl.errors import CheckFailed
    from opsctl.releases import read_state

    host = inv.hosts["lab"]
    conn = lab.connection()
    try:
        before = read_state(conn, host)
        lab.set_fault("gpu_leftover", memory_mib=1000)
        with pytest.raises(CheckFailed) as exc:
            deploy(inv, "ar-tp8", None, gates=False, pre_checks=True)
        assert "gpu_no_leftover_processes" in exc.value.problem
        after = read_state(conn, host)
    finally:
        conn.close()
    assert after.current == before.current and len(after.ledger) == len(before.ledger)
    assert sorted(after.releases) == sorted(before.releases)


def test_stopped_service(lab, inv):
    unit = inv.hosts["lab"].unit_name
    sh(lab, f"systemctl stop {unit}")
    try:
        post = run_checks(inv, "post")
        assert "unit_active" in failing(post), explain(post)
        # what needs a running server fails with it; nothing else does
        assert failing(post) <= SERVING, explain(post)
        assert post.result("unit_file_matches_render").ok and post.result("drafter_checksums").ok
        pre = run_checks(inv, "pre")
        assert pre.ok, explain(pre)  # a stopped service leaves the host ready for a deploy
        assert "free" in pre.result("service_port").message
    finally:
        start_service(lab, unit)


def test_port_taken_by_another_process(lab, inv):
    unit = inv.hosts["lab"].unit_name
    sh(lab, f"systemctl stop {unit}")  # free the port so that another process can take it
    try:
        fault = lab.set_fault("port_holder")
        report = run_checks(inv, "pre")
        only_fails(report, "service_port")
        msg = report.result("service_port").message
        assert f"port 30000 is taken by PID {fault['pid']}" in msg, msg
    finally:
        lab.clear_faults()
        start_service(lab, unit)
