"""Every SSH consumer through a jump host, on the lab (opsctl/host/ssh.py).

The lab's own sshd is the jump: the inventory says `ansible_host: 127.0.0.1` (the guest
as it sees itself) and `ansible_ssh_common_args: "-o ProxyJump=root@<lab address>:22"`,
as Ansible users write it, with the lab's key for both hops. 127.0.0.1:22 on this machine
is not the guest, so anything that ignored the jump would fail (or is refused below,
before the deploy, if this machine would let the lab key in). One short deploy, gates
off: paramiko (`opsctl status`, the deploy's commands), rsync (the drafter weights),
ansible (the prepare playbook), testinfra (`opsctl check`).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from opsctl.config import load_inventory
from opsctl.host.connection import SSHConnection

pytestmark = pytest.mark.lab
FAST = ("--yes", "--no-gate", "--skip-checks")
ACCEPTED = "Accepted publickey for root from 127.0.0.1"


def accepted_via_loopback(lab) -> int:
    """Logins the guest's sshd accepted from 127.0.0.1: the hop from the jump to the target."""
    out = lab.run(f"journalctl -b -o cat --no-pager | grep -c {json.dumps(ACCEPTED)} || true", check=False)
    return int(out.stdout.strip() or 0)


@pytest.fixture(scope="module")
def jump_inventory(clean_lab, tmp_path_factory):
    inv = tmp_path_factory.mktemp("jump") / "inv"
    shutil.copytree(clean_lab.inventory_dir, inv)
    hosts = inv / "hosts.yml"
    text = hosts.read_text()
    assert f"ansible_host: {clean_lab.address}" in text
    hosts.write_text(text.replace(f"ansible_host: {clean_lab.address}", "ansible_host: 127.0.0.1"))
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / "lab.yml").write_text(
        f'ansible_ssh_common_args: "-o ProxyJump={clean_lab.user}@{clean_lab.address}:{clean_lab.port}"\n')
    # safety: if this machine's own sshd took the lab key on 127.0.0.1, a consumer that ignored the
    # jump would deploy here; then this test cannot tell the two apart and must not run
    direct = subprocess.run(["ssh", "-i", str(clean_lab.key_file), "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
                             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                             "-o", "LogLevel=ERROR", "-p", "22", "root@127.0.0.1", "true"],
                            capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    if direct.returncode == 0:
        pytest.skip("this machine's sshd accepts the lab key on 127.0.0.1:22: a missed jump would not show")
    return inv


def test_every_consumer_goes_through_the_jump_host(clean_lab, ops, jump_inventory):
    host = load_inventory(jump_inventory).hosts["lab"]
    assert host.ssh.address == "127.0.0.1"
    assert host.ssh.jump_host is not None and host.ssh.jump_host.address == clean_lab.address
    logins = accepted_via_loopback(clean_lab)

    # paramiko/fabric: a command lands in the guest, arriving from the jump (loopback inside the guest)
    conn = SSHConnection(host)
    try:
        res = conn.run("uname -n; echo $SSH_CONNECTION")
    finally:
        conn.close()
    node, via = (res.stdout.splitlines() + ["", ""])[:2]
    assert node == clean_lab.hostname and via.split()[0] == "127.0.0.1" and via.split()[2:] == ["127.0.0.1", "22"], res.stdout
    proc = ops("status", inventory=jump_inventory)
    assert proc.returncode == 0, proc.stderr

    # a deploy: paramiko for its commands, ansible for the prepare play, rsync for the drafter weights
    # (clean_lab removed every drafter from the host, so bytes must go over the wire)
    t0 = time.monotonic()
    rc, out, err = ops.json("deploy", "dflash", *FAST, inventory=jump_inventory)
    assert rc == 0, err
    o = out["outcomes"][0]
    assert o["result"] == "promoted", o
    assert o["ansible_changed"] > 0 and o["drafter_bytes_sent"] > 0, o
    print(f"deploy through the jump host: {time.monotonic() - t0:.1f}s")
    live = clean_lab.run("readlink /opt/opsctl/current", check=False).stdout.strip()
    assert live.endswith(o["release"])  # checked over the direct path: the deploy reached the guest

    # testinfra: the host checks through the jump (pre and post), the server just started
    deadline = time.monotonic() + 60
    while True:
        rc, report, err = ops.json("check", "all", inventory=jump_inventory)
        if rc == 0 or time.monotonic() > deadline:
            break
        time.sleep(2)
    bad = [r for r in (report or {}).get("results", []) if not r["ok"]]
    assert rc == 0 and report["ok"], f"{err}\n{json.dumps(bad, indent=1)}"
    reach = next(r for r in report["results"] if r["check"] == "ssh_reachable")
    assert reach["message"].endswith(f"-> root on {clean_lab.hostname}"), reach

    # every consumer's logins came in over the guest's loopback: paramiko (twice), ansible, rsync, testinfra
    assert accepted_via_loopback(clean_lab) - logins >= 5
