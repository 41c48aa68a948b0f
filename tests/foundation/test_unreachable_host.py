"""An unreachable host is one line on stderr (issue #49): something accepts the TCP connection but
no SSH server answers (a port that is not sshd, a host that accepts and stalls or drops). paramiko's
transport thread used to print two tracebacks ("Exception (client): Error reading SSH protocol
banner") before opsctl's error, whose fix talked about host keys. No host needed: a local listener
plays the wrong port."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["closes", "stalls", "speaks-http"])
def not_sshd(request):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            if request.param == "stalls":
                held.append(c)  # accepted, never a banner: paramiko's banner timeout
                continue
            if request.param == "speaks-http":
                c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], request.param
    stop.set()
    t.join(2)
    for c in held:
        c.close()
    srv.close()


def _inventory(tmp_path: Path, port: int, strict: bool) -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories" / "lab", inv)
    hosts = inv / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("10.203.9.2", "127.0.0.1").replace("ansible_port: 22",
                                                                                f"ansible_port: {port}"))
    if strict:  # a real host: strict host keys, against a known_hosts file that exists
        kh = tmp_path / "known_hosts"
        kh.write_text("")
        gv = inv / "group_vars" / "all.yml"
        gv.write_text(gv.read_text().replace("ssh_strict_host_keys: false",
                                             f"ssh_strict_host_keys: true\n  ssh_known_hosts: {kh}"))
    return inv


@pytest.mark.parametrize("strict", [False, True], ids=["lab", "strict-host-keys"])
def test_a_port_without_sshd_is_one_line_about_reachability_not_host_keys(not_sshd, strict, tmp_path):
    port, how = not_sshd
    inv = _inventory(tmp_path, port, strict)
    p = subprocess.run([sys.executable, "-m", "opsctl", "status", "-i", str(inv)], capture_output=True,
                       text=True, cwd=REPO, timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 3, (how, p.stdout, p.stderr)
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1, (how, p.stderr)
    assert "Traceback" not in p.stderr and "Exception (client)" not in p.stderr
    line = err[0]
    assert f"127.0.0.1:{port}" in line and "is unreachable" in line and "no SSH server answered" in line, line
    problem, fix = line.split(" (fix: ", 1)
    assert "host key" not in fix and "known_hosts" not in fix, line
    assert "ansible_port" in fix and "sshd" in fix, line
