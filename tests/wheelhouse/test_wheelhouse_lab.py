"""The wheelhouse on the lab host, through the deploy's own code: plan (lock + host Python and
glibc check), ship (content sync), offline install into a fresh venv; and a host whose glibc
is too old (the probe's answer replaced by the test) refused before anything is shipped."""
from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath

import pytest

from opsctl import wheelhouse as wh
from opsctl.flow import deploy as flow
from opsctl.config import load_inventory
from opsctl.errors import ConfigError
from opsctl.host.connection import SSHConnection

ROOT = PurePosixPath("/opt/opsctl-whtest")   # a root of its own: the lab's /opt/opsctl is left alone

pytestmark = pytest.mark.lab


def _host(lab_host, wheelhouse: Path, root: PurePosixPath = ROOT, requirements=("six==1.16.0",)):
    host = lab_host.host_config
    s = host.settings
    runtime = s.runtime.model_copy(update={"wheelhouse": wheelhouse, "base_requirements": tuple(requirements)})
    return host.model_copy(update={"settings": s.model_copy(update={"install_root": root, "runtime": runtime})})


class Recording:
    """The real SSH connection, every command recorded; optionally the host's glibc replaced
    in the answer to the Python/glibc probe (the one value a test cannot change on the host)."""

    def __init__(self, conn, glibc: str | None = None):
        self.conn, self.glibc, self.commands = conn, glibc, []

    def run(self, command: str, **kw):
        self.commands.append(command)
        res = self.conn.run(command, **kw)
        if self.glibc and "CS_GNU_LIBC_VERSION" in command:
            py, arch, _ = res.stdout.split("\n")[:3]
            res = dataclasses.replace(res, stdout=f"{py}\n{arch}\n{self.glibc}\n")
        return res

    def put(self, *a, **kw):
        self.commands.append(f"put {a}")
        return self.conn.put(*a, **kw)

    def get(self, *a, **kw):
        return self.conn.get(*a, **kw)

    def close(self):
        self.conn.close()


@pytest.fixture
def whtest_root(lab_host):
    lab_host.run(f"rm -rf {ROOT} /tmp/whtest-venv")
    yield ROOT
    lab_host.run(f"rm -rf {ROOT} /tmp/whtest-venv")


def test_ship_then_offline_install_into_a_fresh_venv_on_the_host(lab_host, small_set, whtest_root):
    directory, _ = small_set
    host = _host(lab_host, directory)
    conn = lab_host.connection()
    try:
        plan = wh.plan_base_env(conn, host)
        assert plan["host"]["python"] == "3.11" and plan["host"]["glibc"]
        assert plan["present"] is False and plan["send"] == 5        # 4 wheels + pylock.toml
        remote, sync = wh.ship(conn, host)
        assert remote == ROOT / "shared" / "wheelhouses" / plan["digest"]
        assert sync.files_sent == 5 and sync.bytes_sent > 0
        # the lab host has no route anywhere: --no-index is the only way this can succeed
        pkgs = " ".join(f"{e.name}=={e.version}" for e in wh.read_lock(directory).entries if not e.no_deps)
        res = lab_host.run(
            f"set -e; python3 -m venv /tmp/whtest-venv; /tmp/whtest-venv/bin/python -m pip install --quiet "
            f"--no-index --find-links {remote} {pkgs}; /tmp/whtest-venv/bin/python -m pip install --quiet "
            f"--no-index --no-deps --find-links {remote} sglang-ddtree; /tmp/whtest-venv/bin/python -c "
            f"'import six, attrs, markupsafe, importlib.metadata as m; print(six.__version__, attrs.__version__, "
            f"markupsafe.escape(\"<b>\"), m.version(\"sglang-ddtree\"), "
            f"[e.name for e in m.entry_points(group=\"sglang.srt.plugins\")])'", timeout=180)
        assert res.returncode == 0, res.stderr
        # (the runtime itself imports torch, which only the real base environment has)
        assert res.stdout.split()[:4] == ["1.16.0", "24.2.0", "&lt;b&gt;", "0.1.0"] and "'ddtree'" in res.stdout
        # the lock travelled with the wheels and still verifies there
        sums = lab_host.run(f"cd {remote} && sha256sum *.whl pylock.toml", check=True).stdout
        lock = wh.read_lock(directory)
        for e in lock.entries:
            assert f"{e.sha256}  {e.filename}" in sums
        # again: nothing to send
        again = wh.plan_base_env(conn, host)
        assert again["present"] is True and again["bytes_to_send"] == 0
        _, sync2 = wh.ship(conn, host)
        assert sync2.already_present and sync2.bytes_sent == 0
    finally:
        conn.close()


def test_a_changed_set_sends_only_the_new_file(lab_host, small_set, wh_copy, runtime_wheel, whtest_root):
    host = _host(lab_host, small_set[0])
    conn = lab_host.connection()
    try:
        wh.ship(conn, host)
        # same set plus one more wheel: only it (and the new lock) go over the wire
        res = wh.build(wh_copy, ["six==1.16.0", "attrs==24.2.0", "markupsafe==2.1.5", "idna==3.7"],
                       wh.Target("3.11", "manylinux_2_34_x86_64"), add=[runtime_wheel])
        assert [f.split("-")[0] for f in res.downloaded] == ["idna"]
        plan = wh.plan_base_env(conn, _host(lab_host, wh_copy))
        assert plan["send"] == 2 and plan["link"] == 4
        remote, sync = wh.ship(conn, _host(lab_host, wh_copy))
        assert sync.files_sent == 2 and sync.files_linked == 4
        links = lab_host.run(f"stat -c %h {remote}/six-1.16.0-py2.py3-none-any.whl", check=True).stdout.strip()
        assert links == "2"   # hard-linked to the first wheelhouse's copy
    finally:
        conn.close()


def test_host_with_too_old_glibc_is_refused_before_anything_is_shipped(lab_host, small_set, whtest_root,
                                                                       monkeypatch):
    """Through the deploy itself: a fresh host (no base env) whose glibc says 2.12 while
    MarkupSafe's wheel needs 2.17. The refusal names both; nothing on the host changes."""
    host = _host(lab_host, small_set[0], requirements=("six==1.16.0", "markupsafe==2.1.5"))
    inv = load_inventory(lab_host.inventory_dir)
    inv = inv.model_copy(update={"hosts": {"lab": host}})
    recorders = []

    def connect(h):
        rec = Recording(SSHConnection(h), glibc="2.12")
        recorders.append(rec)
        return rec

    before = lab_host.run(f"ls -la {ROOT} 2>&1; ls /opt/opsctl/shared 2>&1").stdout
    monkeypatch.setattr(flow, "connect", connect)
    with pytest.raises(ConfigError) as exc:
        flow.deploy(inv, "ar-tp8", pre_checks=False, gates=False)
    msg = exc.value.one_line()
    assert "glibc 2.12" in msg and "glibc >= 2.17" in msg and "MarkupSafe-2.1.5" in msg, msg
    assert "nothing was shipped" in msg and "--platform manylinux_2_12_x86_64" in msg
    assert lab_host.run(f"ls -la {ROOT} 2>&1; ls /opt/opsctl/shared 2>&1").stdout == before
    assert lab_host.run(f"test -e {ROOT}").returncode != 0
    # the deploy ran its reads (state, base env, the probe) and nothing that writes
    cmds = [c for r in recorders for c in r.commands]
    assert any("CS_GNU_LIBC_VERSION" in c for c in cmds)
    assert not any(w in c for c in cmds for w in ("mkdir", "rsync", "mv -T", "ln -f", "rm -", "put (")), cmds
