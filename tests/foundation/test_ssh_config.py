"""One SSH configuration per host (opsctl/host/ssh.py), built once from the inventory and
rendered for each consumer: paramiko/fabric, rsync's -e, ansible, testinfra. Each for a
plain host (the lab's settings), strict host keys, and a jump host. No host needed: the
renderings are compared as text/argv, and checked by the real parsers (`ssh -G`, rsync's
own -e splitting, Ansible's ssh plugin) with a fake `ssh` that records its argv."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from opsctl.config import load_inventory
from opsctl.errors import ConfigError, HostError
from opsctl.host.ssh import JumpHost, SSHSettings, parse_jump

REPO = Path(__file__).resolve().parents[2]
KEY = "/var/lib/opsctl-lab/id_ed25519"
LAB_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
BASE = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=15", "-o", "IdentitiesOnly=yes"]


@pytest.fixture(autouse=True)
def _no_user_ssh_config(tmp_path, monkeypatch):
    """fabric reads ~/.ssh/config when a Connection is built: keep this user's out."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


def inventory(tmp_path: Path, host_vars: str = "", group_vars_extra: str = "") -> Path:
    """inventories/lab, with host_vars/lab.yml and extra lines appended to group_vars/all.yml."""
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventories" / "lab", inv)
    if host_vars:
        (inv / "host_vars").mkdir()
        (inv / "host_vars" / "lab.yml").write_text(host_vars)
    if group_vars_extra:
        gv = inv / "group_vars" / "all.yml"
        gv.write_text(gv.read_text().replace("opsctl:\n", "opsctl:\n" + group_vars_extra, 1))
    return inv


@pytest.fixture
def plain() -> SSHSettings:
    return load_inventory(REPO / "inventories" / "lab").hosts["lab"].ssh


@pytest.fixture
def strict(plain, tmp_path) -> SSHSettings:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    return plain.model_copy(update={"strict_host_keys": True, "known_hosts": kh})


@pytest.fixture
def jumped(tmp_path) -> SSHSettings:
    """The lab seen through its own sshd: jump root@10.203.9.2:22, target 127.0.0.1:22 (the lab test's setup)."""
    inv = inventory(tmp_path, 'ansible_host: 127.0.0.1\nansible_ssh_common_args: "-o ProxyJump=root@10.203.9.2:22"\n')
    return load_inventory(inv).hosts["lab"].ssh


def proxy_argv(s: SSHSettings) -> list[str]:
    return ["ssh", "-p", "22", *BASE, "-i", KEY, *LAB_OPTS, "-W", "127.0.0.1:22", "-l", "root", "10.203.9.2"]


# --------------------------------------------------------------------------- the inventory


def test_plain_host_from_the_lab_inventory(plain):
    assert (plain.address, plain.user, plain.port, str(plain.key_file)) == ("10.203.9.2", "root", 22, KEY)
    assert not plain.strict_host_keys and plain.jump_host is None
    assert plain.first_hop == ("10.203.9.2", 22) and plain.describe() == "root@10.203.9.2:22"


@pytest.mark.parametrize("args", ["-o ProxyJump=root@10.203.9.2:22", "-o ProxyJump=10.203.9.2",
                                  "-oProxyJump=root@10.203.9.2", "-o 'ProxyJump root@10.203.9.2:22'",
                                  "-J root@10.203.9.2", "-o proxyjump=ssh://root@10.203.9.2:22"])
def test_jump_host_as_ansible_users_write_it(tmp_path, args):
    inv = inventory(tmp_path, f"ansible_host: 127.0.0.1\nansible_ssh_common_args: {json.dumps(args)}\n")
    s = load_inventory(inv).hosts["lab"].ssh
    assert s.jump_host == JumpHost(address="10.203.9.2", user="root", port=22)  # user: ansible_user; port 22
    assert s.first_hop == ("10.203.9.2", 22)
    assert s.describe() == "root@127.0.0.1:22 via root@10.203.9.2:22"


def test_jump_host_as_an_opsctl_key_and_both_forms_agreeing(tmp_path):
    inv = inventory(tmp_path, group_vars_extra="  ssh_jump_host: ops@bastion.example:2222\n")
    assert load_inventory(inv).hosts["lab"].ssh.jump_host == JumpHost(address="bastion.example", user="ops", port=2222)
    inv2 = inventory(tmp_path / "b", 'ansible_ssh_common_args: "-o ProxyJump=ops@bastion.example:2222"\n',
                     "  ssh_jump_host: ops@bastion.example:2222\n")
    assert load_inventory(inv2).hosts["lab"].ssh.jump_host.spec == "ops@bastion.example:2222"
    # host_vars can take a group's jump away again (the host's whole opsctl: mapping, as Ansible reads it)
    full = yaml.safe_load((REPO / "inventories/lab/group_vars/all.yml").read_text())["opsctl"]
    inv3 = inventory(tmp_path / "c", yaml.safe_dump({"opsctl": {**full, "ssh_jump_host": None}}),
                     "  ssh_jump_host: bastion\n")
    assert load_inventory(inv3).hosts["lab"].ssh.jump_host is None


@pytest.mark.parametrize("host_vars, group_extra, words", [
    ('ansible_ssh_common_args: "-o ProxyJump=a@j1"\n', "  ssh_jump_host: b@j2\n", "given twice"),
    ('ansible_ssh_common_args: "-o ProxyJump=a@j1,b@j2"\n', "", "several jump hosts"),
    ('ansible_ssh_common_args: "-o ProxyJump=j1:port"\n', "", "not a number"),
    ('ansible_ssh_common_args: "-o ForwardAgent=yes"\n', "", "-o ForwardAgent=yes"),
    ('ansible_ssh_extra_args: "-o ProxyCommand=\'nc %h %p\'"\n', "", "ProxyCommand"),
    ('ansible_ssh_common_args: "-v"\n', "", "'-v'"),
    ('ansible_ssh_common_args: "-o ProxyJump"\n', "", "not '-o ProxyJump'"),
    ('ansible_ssh_common_args: "-J"\n', "", "-J without a value"),
    ("", "  ssh_jump: bastion\n", "ssh_jump"),                # unknown opsctl keys stay refused
    ("", "  ssh_jump_host: 'a b'\n", "is not [user@]host[:port]"),
])
def test_bad_jump_settings_are_config_errors(tmp_path, host_vars, group_extra, words):
    inv = inventory(tmp_path, host_vars, group_extra)
    with pytest.raises(ConfigError) as exc:
        load_inventory(inv)
    assert words in exc.value.problem and "host lab" in exc.value.problem, exc.value.problem
    assert exc.value.exit_code == 2


@pytest.mark.parametrize("spec, want", [
    ("bastion", ("bastion", "dflt", 22)), ("u@h:2200", ("h", "u", 2200)), ("[::1]:2200", ("::1", "dflt", 2200)),
    ("u@[fe80::1]", ("fe80::1", "u", 22)), ("fe80::1", ("fe80::1", "dflt", 22)), ("ssh://u@h:1", ("h", "u", 1)),
])
def test_parse_jump_forms(spec, want):
    j = parse_jump(spec, "dflt")
    assert (j.address, j.user, j.port) == want
    assert parse_jump("none", "x") is None
    with pytest.raises(ValueError):
        parse_jump("h:99999", "x")


# --------------------------------------------------------------------------- paramiko / fabric


def test_paramiko_kwargs_and_fabric_connection_plain(plain):
    import paramiko

    kw = plain.paramiko_connect_kwargs()
    assert kw == {"timeout": 5.0, "allow_agent": False, "look_for_keys": False, "banner_timeout": 5.0,
                  "auth_timeout": 5.0, "key_filename": KEY}
    conn = plain.fabric_connection("lab")
    assert (conn.host, conn.port, conn.user, conn.gateway) == ("10.203.9.2", 22, "root", None)
    assert conn.connect_kwargs == {**kw, "key_filename": [KEY]}  # fabric keeps key files as a list
    assert isinstance(conn.client._policy, paramiko.AutoAddPolicy)


def test_fabric_connection_strict_host_keys(strict, tmp_path):
    import paramiko

    key = paramiko.ECDSAKey.generate()
    strict.known_hosts.write_text(f"10.203.9.2 {key.get_name()} {key.get_base64()}\n")
    conn = strict.fabric_connection("lab")
    assert isinstance(conn.client._policy, paramiko.RejectPolicy)
    assert "10.203.9.2" in conn.client.get_host_keys()
    strict.known_hosts.unlink()
    with pytest.raises(HostError) as exc:
        strict.fabric_connection("lab")
    assert "does not exist" in exc.value.problem and "ssh-keyscan -p 22 10.203.9.2" in exc.value.fix


def test_fabric_connection_through_the_jump_host(jumped, tmp_path):
    import paramiko
    from fabric import Connection

    conn = jumped.fabric_connection("lab")
    assert (conn.host, conn.port, conn.user) == ("127.0.0.1", 22, "root")
    gw = conn.gateway
    assert isinstance(gw, Connection)  # fabric opens a direct-tcpip channel on it as the sock
    assert (gw.host, gw.port, gw.user) == ("10.203.9.2", 22, "root")
    assert gw.connect_kwargs == conn.connect_kwargs == {**jumped.paramiko_connect_kwargs(), "key_filename": [KEY]}
    assert isinstance(gw.client._policy, paramiko.AutoAddPolicy)
    # strict: both hops check the same known_hosts; a missing file names how to fill it for each hop
    strict = jumped.model_copy(update={"strict_host_keys": True, "known_hosts": tmp_path / "kh"})
    with pytest.raises(HostError) as exc:
        strict.fabric_connection("lab")
    assert "jump host root@10.203.9.2:22" in exc.value.problem
    assert exc.value.fix.endswith(f"ssh-keyscan -p 22 10.203.9.2 >> {tmp_path / 'kh'}")
    (tmp_path / "kh").write_text("")
    conn = strict.fabric_connection("lab")
    assert isinstance(conn.client._policy, paramiko.RejectPolicy)
    assert isinstance(conn.gateway.client._policy, paramiko.RejectPolicy)


def test_ssh_connection_reports_a_dead_jump_host(jumped):
    from opsctl.config import HostConfig
    from opsctl.host.connection import SSHConnection

    lab = load_inventory(REPO / "inventories" / "lab").hosts["lab"]
    dead = jumped.model_copy(update={"jump_host": JumpHost(address="127.0.0.1", user="root", port=9)})
    host = HostConfig(name="lab", ssh=dead, settings=lab.settings)
    with pytest.raises(HostError) as exc:
        SSHConnection(host).run("true")
    assert "jump host root@127.0.0.1:9" in exc.value.problem and "unreachable" in exc.value.problem


# --------------------------------------------------------------------------- ssh / rsync


def test_rsync_e_plain_strict_and_jump(plain, strict, jumped):
    assert plain.ssh_argv() == ["ssh", "-p", "22", *BASE, "-i", KEY, *LAB_OPTS]
    assert plain.rsync_rsh() == shlex.join(["ssh", "-p", "22", *BASE, "-i", KEY, *LAB_OPTS])
    assert plain.rsync_remote("/opt/x/") == "root@10.203.9.2:/opt/x/"
    assert strict.ssh_argv() == ["ssh", "-p", "22", *BASE, "-i", KEY, "-o", "StrictHostKeyChecking=yes",
                                 "-o", f"UserKnownHostsFile={strict.known_hosts}"]
    assert jumped.ssh_argv() == ["ssh", "-p", "22", *BASE, "-i", KEY, *LAB_OPTS,
                                 "-o", "ProxyCommand=" + shlex.join(proxy_argv(jumped))]
    assert jumped.rsync_remote("/d/") == "root@127.0.0.1:/d/"
    # extra options (the fast ciphers) go to both hops; IPv6 gets brackets where ssh/rsync want them
    v6 = jumped.model_copy(update={"address": "fd00::2"})
    argv = v6.ssh_argv("-o", "Ciphers=aes128-gcm@openssh.com")
    proxy = shlex.split(argv[-1].removeprefix("ProxyCommand="))
    assert proxy[-5:] == ["-W", "[fd00::2]:22", "-l", "root", "10.203.9.2"]
    assert argv.count("Ciphers=aes128-gcm@openssh.com") == 1 and "Ciphers=aes128-gcm@openssh.com" in proxy
    assert v6.rsync_remote("/d/") == "root@[fd00::2]:/d/"


def test_ssh_parses_the_rendered_options(jumped, strict):
    """`ssh -G` (no connection) reads the argv as we mean it: proxy, key, host-key policy."""
    for s in (jumped, strict):
        proc = subprocess.run(["ssh", "-G", *s.ssh_argv()[1:], f"{s.user}@{s.address}"],
                              capture_output=True, text=True, timeout=10)
        assert proc.returncode == 0, proc.stderr
        got = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
        assert got["hostname"] == s.address and got["batchmode"] == "yes"
        assert got["userknownhostsfile"] == ("/dev/null" if s is jumped else str(s.known_hosts))
        if s is jumped:
            assert got["proxycommand"] == shlex.join(proxy_argv(s))


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """An `ssh` that records its argv (one JSON list a line) and fails like an unreachable host."""
    log = tmp_path / "ssh-argv.jsonl"
    fake = tmp_path / "fake-ssh"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                    "sys.stderr.write('fake ssh: no route\\n'); sys.exit(255)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    return fake, log


@pytest.mark.skipif(not shutil.which("rsync"), reason="rsync is not installed")
def test_rsync_splits_the_e_string_as_rendered(jumped, fake_ssh, tmp_path):
    """rsync's own -e parsing keeps the ProxyCommand (nested quotes included) one argument."""
    fake, log = fake_ssh
    s = jumped.model_copy(update={"key_file": Path("/keys/with space/id")})
    rsh = s.rsync_rsh("-o", "Ciphers=aes128-ctr")
    assert rsh.startswith("ssh ")
    subprocess.run(["rsync", "-a", "-e", str(fake) + rsh[3:], f"{tmp_path}/", s.rsync_remote("/dest/")],
                   capture_output=True, timeout=30)
    argv = json.loads(log.read_text().splitlines()[0])
    assert argv[:len(s.ssh_argv("-o", "Ciphers=aes128-ctr")) - 1] == s.ssh_argv("-o", "Ciphers=aes128-ctr")[1:]
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert "-i '/keys/with space/id'" in proxy and proxy.endswith("-W 127.0.0.1:22 -l root 10.203.9.2")


def test_artifacts_sync_uses_the_rendered_command(tmp_path, monkeypatch):
    """artifacts._rsync hands rsync exactly the settings' -e string and remote."""
    from opsctl import artifacts

    inv = inventory(tmp_path, 'ansible_host: 127.0.0.1\nansible_ssh_common_args: "-o ProxyJump=root@10.203.9.2"\n')
    host = load_inventory(inv).hosts["lab"]
    seen = {}

    def run(cmd, **kw):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 0, "Total bytes sent: 1,234\n", "")

    monkeypatch.setattr(artifacts.subprocess, "run", run)
    assert artifacts._rsync(host, tmp_path, ["a"], Path("/opt/d")) == 1234
    cmd = seen["cmd"]
    assert cmd[cmd.index("-e") + 1] == host.ssh.rsync_rsh("-o", f"Ciphers={artifacts.FAST_CIPHERS}")
    assert cmd[-1] == "root@127.0.0.1:/opt/d/"
    assert artifacts.ssh_command(host) == host.ssh.ssh_argv()


# --------------------------------------------------------------------------- ansible


def test_ansible_vars_plain_strict_and_jump(plain, strict, jumped):
    assert plain.ansible_envvars() == {
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_SSH_ARGS": "-o ConnectTimeout=5 -o ServerAliveInterval=15 -o IdentitiesOnly=yes -o ControlMaster=auto "
                            "-o ControlPersist=60s -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                            "-o LogLevel=ERROR"}
    assert plain.ansible_extravars() == {
        "ansible_host": "10.203.9.2", "ansible_port": 22, "ansible_user": "root",
        "ansible_ssh_args": plain.ansible_envvars()["ANSIBLE_SSH_ARGS"], "ansible_ssh_common_args": "",
        "ansible_ssh_extra_args": "", "ansible_ssh_private_key_file": KEY}
    env = strict.ansible_envvars()
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert env["ANSIBLE_SSH_ARGS"].endswith(f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={strict.known_hosts}")
    ev = jumped.ansible_extravars()
    assert ev["ansible_host"] == "127.0.0.1"
    # Ansible splits ansible_ssh_common_args with shlex: one -o, one ProxyCommand
    assert shlex.split(ev["ansible_ssh_common_args"]) == ["-o", "ProxyCommand=" + shlex.join(proxy_argv(jumped))]


@pytest.mark.skipif(not (Path(sys.executable).parent / "ansible-playbook").exists(), reason="no ansible-playbook")
def test_ansible_connects_with_the_rendered_args(tmp_path, fake_ssh, monkeypatch):
    """Through run_playbook, ansible-runner and Ansible's ssh plugin: the ssh it starts gets the
    jump as one ProxyCommand, the resolved key and the target, whatever the inventory's own
    ansible_ssh_common_args said."""
    from opsctl.playbook import run_playbook

    fake, log = fake_ssh
    monkeypatch.setenv("ANSIBLE_SSH_EXECUTABLE", str(fake))
    inv_dir = inventory(tmp_path, 'ansible_host: 127.0.0.1\n'
                                  'ansible_ssh_common_args: "-o ProxyJump=root@127.0.0.1:9"\n')
    inv = load_inventory(inv_dir)
    host = inv.hosts["lab"]
    extravars = {"opsctl_release_id": "r1", "opsctl_root": "/nonexistent/opsctl", "opsctl_env_dir": "/nonexistent/e",
                 "opsctl_wheelhouse_dir": "/nonexistent/w", "opsctl_service_user": "",
                 "opsctl_onhost_b64": "", "opsctl_metrics_b64": ""}
    with pytest.raises(HostError) as exc:
        run_playbook(inv, host, "prepare.yml", extravars, timeout_s=120)
    assert "unreachable" in exc.value.problem and "via root@127.0.0.1:9" in exc.value.problem
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    argv = next(c for c in calls if "127.0.0.1" in c)
    proxy = [a for a in argv if a.startswith("ProxyCommand=")]
    assert proxy == ["ProxyCommand=" + host.ssh.proxy_command()], argv
    assert "ProxyJump=root@127.0.0.1:9" not in " ".join(argv)
    assert "StrictHostKeyChecking=no" in argv and "ControlMaster=auto" in argv
    assert any(KEY in a for a in argv)


# --------------------------------------------------------------------------- testinfra


def test_testinfra_spec_and_ssh_config(plain, strict, jumped, tmp_path):
    from opsctl.checks.plugin import ssh_config_text

    assert plain.testinfra_hostspec() == "ssh://root@10.203.9.2:22"
    assert jumped.testinfra_hostspec() == "ssh://root@127.0.0.1:22"
    block = plain.ssh_config_block(["lab", "10.203.9.2"], Path("/tmp/c"))
    assert block.splitlines() == ["Host lab 10.203.9.2", "  HostName 10.203.9.2", "  User root", "  Port 22",
                                  f"  IdentityFile {KEY}", "  IdentitiesOnly yes", "  StrictHostKeyChecking no",
                                  "  UserKnownHostsFile /dev/null", "  BatchMode yes", "  ConnectTimeout 5",
                                  "  ServerAliveInterval 15", "  LogLevel ERROR", "  ControlPath /tmp/c/cm-%C"]
    assert f"  UserKnownHostsFile {strict.known_hosts}" in strict.ssh_config_block(["lab"]).splitlines()
    lines = jumped.ssh_config_block(["lab", "127.0.0.1"]).splitlines()
    assert "  HostName 127.0.0.1" in lines and f"  ProxyCommand {shlex.join(proxy_argv(jumped))}" in lines
    # what testinfra's ssh backend does with it: ssh -F <file> <name>
    lab = load_inventory(REPO / "inventories" / "lab").hosts["lab"].model_copy(update={"ssh": jumped})
    cfg = tmp_path / "ssh_config"
    cfg.write_text(ssh_config_text([lab], tmp_path))
    proc = subprocess.run(["ssh", "-G", "-F", str(cfg), "lab"], capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr
    got = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert (got["hostname"], got["user"], got["port"]) == ("127.0.0.1", "root", "22")
    assert got["proxycommand"] == shlex.join(proxy_argv(jumped)) and got["identityfile"] == KEY


def test_checks_take_the_loaded_inventory_not_the_disk(tmp_path, monkeypatch):
    """run_checks hands its Inventory to the plugin (same process): no second load from disk,
    and what the checks connect to is what the caller loaded (here: through a dead jump host)."""
    from opsctl.checks import plugin
    from opsctl.checks.runner import run_checks

    def no_reload(path):
        raise AssertionError(f"the checks plugin read the inventory again from {path}")

    inv = load_inventory(inventory(tmp_path, 'ansible_host: 127.0.0.1\n'
                                             'ansible_ssh_common_args: "-o ProxyJump=root@127.0.0.1:9"\n'))
    monkeypatch.setattr(plugin, "load_inventory", no_reload)
    seen = []
    real = plugin.ssh_config_text
    monkeypatch.setattr(plugin, "ssh_config_text", lambda hosts, d=None: seen.append(real(hosts, d)) or seen[-1])
    report = run_checks(inv, "pre")
    assert report.pytest_exit_code == 1, report.output[-2000:]
    first = report.result("ssh_reachable")
    assert first is not None and first.outcome == "failed", report.output[-2000:]
    assert "ProxyCommand ssh -p 9 " in seen[0] and "-W 127.0.0.1:22" in seen[0]
