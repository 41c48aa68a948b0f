"""The lab host itself: a real systemd machine over SSH, the emulator as a unit, faults, teardown.

Marked `lab` (root + systemd-nspawn). The last test halts the lab, asserts nothing
is left on this machine, and boots it again (down -> up), so it runs last here.
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from opsctl import lab
from opsctl.lab import constants as C

pytestmark = pytest.mark.lab

UNIT = "opsctl-labtest.service"
EMU_UNIT = "opsctl-labtest-emu.service"
VENV = "/opt/opsctl-labtest/venv"
PORT = 30123          # not the service port: other suites deploy sglang-k26 on 30000 in the same lab


def _wait(pred, timeout=30.0, step=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return None


def test_boots_a_real_systemd_host(lab_host):
    r = lab_host.run("cat /proc/1/comm; hostname; systemctl is-system-running; ip -4 -br addr show dev olab-g")
    out = r.stdout.split()
    assert r.returncode == 0 and out[0] == "systemd" and out[1] == "gpuhost", r
    assert out[2] in ("running", "degraded")
    assert "10.203.9.2/30" in r.stdout
    # no default route out of the namespace: the guest reaches only the host side of the veth
    assert lab_host.run("ip route show default").stdout.strip() == ""


def test_the_labs_own_commands_share_one_ssh_connection(lab_host):
    import subprocess

    def accepted() -> int:  # sshd logs one line per connection it accepts
        return lab_host.run("journalctl -u ssh --no-pager -o cat | grep -c '^Accepted publickey'").stdout.strip()

    before = accepted()
    for _ in range(5):
        assert lab_host.run("true").returncode == 0
    assert accepted() == before   # six commands, no new connection
    sock = lab.host.control_path(lab_host.node)
    check = subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "check", f"root@{lab_host.address}"],
                           capture_output=True, text=True, timeout=10)
    assert check.returncode == 0, check.stderr


def test_unit_by_hand_active_and_journal(lab_host):
    unit = f"""[Unit]
Description=opsctl lab test unit
[Service]
ExecStart=/bin/bash -c 'echo opsctl-labtest says hello; exec sleep infinity'
[Install]
WantedBy=multi-user.target
"""
    lab_host.run(f"cat > /etc/systemd/system/{UNIT}", stdin=unit, check=True)
    lab_host.run(f"systemctl daemon-reload && systemctl start {UNIT}", check=True)
    assert lab_host.run(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    journal = _wait(lambda: (lambda o: o if "opsctl-labtest says hello" in o else None)(
        lab_host.run(f"journalctl -u {UNIT} --no-pager -o cat").stdout), 10)
    assert journal, "unit output not in the journal"
    lab_host.run(f"systemctl stop {UNIT}", check=True)
    assert lab_host.run(f"systemctl is-active {UNIT}").stdout.strip() == "inactive"


def test_guest_has_site_stand_ins(lab_host):
    r = lab_host.run("nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader,nounits",
                     check=True)
    rows = [x.split(", ") for x in r.stdout.strip().splitlines()]
    assert len(rows) == 8 and {x[0] for x in rows} == {"NVIDIA RTX PRO 6000 Blackwell Workstation Edition"}
    assert {x[1] for x in rows} == {"97887"}
    assert "release 13.0" in lab_host.run("nvcc --version", check=True).stdout
    cfg = json.loads(lab_host.run(f"cat {C.GUEST_MODEL_PATH}/config.json", check=True).stdout)
    assert cfg["architectures"]
    # guest-only: this machine has no nvidia-smi and no model dir
    assert not Path(C.GUEST_NVIDIA_SMI).exists() and not Path(C.GUEST_MODEL_PATH).exists()
    # artifacts on this machine, visible to the deploy
    assert (C.WHEELHOUSE / "sglang-0.5.23+lab-py3-none-any.whl").exists()
    drafter = json.loads((C.DRAFTER_DIR / "config.json").read_text())
    assert drafter["block_size"] == 8 and (C.DRAFTER_DIR / "model.safetensors").stat().st_size > 2 ** 20


def _emu_unit(extra: str = "") -> str:
    return f"""[Unit]
Description=opsctl lab emulator test
[Service]
ExecStart={VENV}/bin/python -m sglang.launch_server --model-path {C.GUEST_MODEL_PATH} --tp-size 8 \\
  --host 0.0.0.0 --port {PORT} --cuda-graph-max-bs-decode 16 --enable-metrics {extra}
Restart=no
"""


@pytest.fixture(scope="module")
def emulator_venv(lab_host):
    """The emulator installed from the lab wheelhouse into a bare venv, as a deploy does."""
    r = lab_host.run(f"rm -rf {VENV} && /usr/bin/python3 -m venv {VENV} && "
                     f"{VENV}/bin/pip install -q --no-index --find-links {C.WHEELHOUSE} 'sglang==0.5.23' && "
                     f"{VENV}/bin/python -c 'import sglang, importlib.metadata as m; print(m.version(\"sglang\"))'",
                     timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "0.5.23+lab"
    yield VENV
    lab_host.run(f"systemctl stop {EMU_UNIT}; rm -f /etc/systemd/system/{EMU_UNIT}; systemctl daemon-reload; "
                 f"rm -rf /opt/opsctl-labtest")
    lab_host.clear_faults()


def _start_emu(lab_host, extra: str = ""):
    lab_host.run(f"systemctl stop {EMU_UNIT} 2>/dev/null; systemctl reset-failed {EMU_UNIT} 2>/dev/null; "
                 f"cat > /etc/systemd/system/{EMU_UNIT} && systemctl daemon-reload && "
                 f"journalctl --rotate >/dev/null 2>&1; systemctl start {EMU_UNIT}", stdin=_emu_unit(extra), check=True)


def _journal(lab_host) -> str:
    return lab_host.run(f"journalctl -u {EMU_UNIT} --no-pager -o cat -b", timeout=30).stdout


def _http(path: str, timeout: float = 5) -> int:
    try:
        with urllib.request.urlopen(f"http://{C.GUEST_IP}:{PORT}{path}", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_emulator_runs_as_a_unit_and_answers_from_the_host(lab_host, emulator_venv):
    lab_host.clear_faults()
    _start_emu(lab_host)
    assert _wait(lambda: _http("/health_generate") == 200, 30), _journal(lab_host)[-2000:]
    assert lab_host.run(f"systemctl is-active {EMU_UNIT}").stdout.strip() == "active"
    text = _journal(lab_host)
    assert "The server is fired up and ready to roll!" in text
    assert re.search(r"\[\S+ \S+ TP7\] Capture target decode CUDA graph end\. bs=\[1, 2, 4, 8, 12, 16\]", text)
    pid = lab_host.run(f"systemctl show -p MainPID --value {EMU_UNIT}").stdout.strip()
    apps = lab_host.run("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader").stdout
    assert pid in apps, apps


def test_lab_faults_over_ssh(lab_host, emulator_venv):
    lab.set_fault("capture-failure")
    assert "capture_failure" in lab.list_faults()["active"]
    _start_emu(lab_host)
    state = _wait(lambda: (lambda s: s if s in ("failed", "inactive") else None)(
        lab_host.run(f"systemctl is-active {EMU_UNIT}").stdout.strip()), 20)
    assert state == "failed"
    text = _journal(lab_host)
    assert "Exception: Capture cuda graph failed: CUDA error: out of memory" in text
    lab.clear_fault("capture_failure")
    assert lab.list_faults()["active"] == {}

    # host conditions: a leftover GPU process, a process holding the service port
    info = lab.set_fault("gpu-leftover")
    apps = lab_host.run("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader").stdout
    assert str(info["pid"]) in apps
    lab.set_fault("port-holder", port=PORT)
    assert lab_host.run(f"ss -Htln 'sport = :{PORT}'").stdout.strip()
    _start_emu(lab_host)
    assert _wait(lambda: lab_host.run(f"systemctl is-active {EMU_UNIT}").stdout.strip() == "failed", 20)
    assert "address already in use" in _journal(lab_host)
    cleared = lab.clear_fault()
    assert {"gpu_leftover", "port_holder"} <= set(cleared)
    assert str(info["pid"]) not in lab_host.run("nvidia-smi --query-compute-apps=pid --format=csv,noheader").stdout
    assert lab_host.run(f"ss -Htln 'sport = :{PORT}'").stdout.strip() == ""


def _assert_nothing_left(nspawn_pid: int | None):
    assert lab.leftovers() == []
    assert C.NETNS not in os.popen("ip netns list").read()
    assert not Path(f"/sys/class/net/{C.VETH_HOST}").exists()
    for d in lab.host.cgroup_dirs():
        assert not d.exists(), d
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(C.STATE_DIR) not in mounts and f"/run/netns/{C.NETNS}" not in mounts
    if nspawn_pid:
        assert not Path(f"/proc/{nspawn_pid}").exists() or "Z" in Path(f"/proc/{nspawn_pid}/stat").read_text().split(")")[1][:3]
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            assert b"--machine=opsctl-lab" not in cmd, (p.name, cmd)


def test_zz_unit_by_hand_then_down_leaves_nothing_then_up_again(lab_host):
    """The whole chain: a unit installed by hand over SSH runs (`active`, journal), then the lab goes
    down leaving no namespace, veth, mount, cgroup or process behind, and comes up again."""
    unit = "[Service]\nExecStart=/bin/bash -c 'echo chain-test-line; exec sleep infinity'\n"
    lab_host.run(f"cat > /etc/systemd/system/{UNIT} && systemctl daemon-reload && systemctl start {UNIT}",
                 stdin=unit, check=True)
    assert lab_host.run(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    assert _wait(lambda: "chain-test-line" in lab_host.run(f"journalctl -u {UNIT} -o cat --no-pager").stdout, 10)
    pid = lab.status(probe_ssh=False).pid
    assert pid
    t0 = time.monotonic()
    lab.down(say=print)
    down_s = time.monotonic() - t0
    _assert_nothing_left(pid)
    t0 = time.monotonic()
    st = lab.up(say=print)
    up_s = time.monotonic() - t0
    assert st.running and st.ssh and st.system_state in ("running", "degraded")
    print(f"lab down {down_s:.1f}s, up again {up_s:.1f}s")
    # a crashed run (nspawn killed hard) is cleaned up by the next up
    os.kill(st.pid, 9)
    time.sleep(0.5)
    st = lab.up(say=print)
    assert st.running and st.ssh
