"""One SSH configuration per host, built once from the inventory, rendered for each consumer.

`SSHSettings` is what `HostConfig.ssh` holds (opsctl.config builds it when the inventory
is loaded, from `ansible_host`/`ansible_user`/`ansible_port`/`ansible_ssh_private_key_file`,
`opsctl.ssh_known_hosts`/`ssh_strict_host_keys` and the jump host). Nothing else assembles
SSH options; each consumer asks for its rendering:

    paramiko / fabric   paramiko_connect_kwargs(), fabric_connection() (a jump host is
                        fabric's gateway= Connection: a direct-tcpip channel as the sock)
    ssh / rsync         ssh_argv(), rsync_rsh() for `rsync -e`, rsync_remote(path)
    ansible             ansible_envvars(), ansible_extravars() (extra vars win over the
                        inventory, so Ansible connects exactly as the rest of opsctl)
    testinfra           ssh_config_block() for its --ssh-config, testinfra_hostspec()

A jump host is written as Ansible users write it, `ansible_ssh_common_args:
"-o ProxyJump=user@host:port"`, or as `opsctl.ssh_jump_host: user@host:port`. It is
reached with the same key, host-key policy and timeouts as the target. OpenSSH's
ProxyJump given on a command line does not pass -i or -o options to the jump hop, so the
ssh-based consumers get an explicit `ProxyCommand=ssh ... -W target:port -l user jump`.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opsctl.errors import ConfigError, HostError

if TYPE_CHECKING:  # pragma: no cover
    from fabric import Connection as FabricConnection

# inventory variables whose SSH options Ansible would apply: only a ProxyJump is accepted in
# them (any other option would reach Ansible's ssh and not paramiko, rsync or testinfra)
SSH_ARG_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")
JUMP_FORM = "[user@]host[:port]"


def _bracket(address: str) -> str:
    """`[::1]` for an IPv6 address in host:port forms, the address otherwise."""
    return f"[{address}]" if ":" in address else address


def _num(value: float) -> str:
    return f"{value:g}"


class JumpHost(BaseModel):
    """The one host SSH goes through to reach the target (a bastion)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = Field(min_length=1, pattern=r"^[^\s@,/]+$")
    user: str = Field(min_length=1, pattern=r"^[^\s@:]+$")
    port: int = Field(22, ge=1, le=65535)

    @property
    def spec(self) -> str:
        """As ProxyJump writes it: user@host:port."""
        return f"{self.user}@{_bracket(self.address)}:{self.port}"


def parse_jump(spec: str, default_user: str) -> JumpHost | None:
    """`[user@]host[:port]` (ProxyJump's form, `ssh://` allowed) -> JumpHost; `none` -> None.
    The user defaults to the target's, the port to 22. Raises ValueError."""
    text = str(spec).strip()
    if text.lower() in ("", "none"):
        return None
    text = text.removeprefix("ssh://")
    if "," in text:
        raise ValueError(f"{spec!r} names several jump hosts; opsctl goes through one")
    user, _, hostport = text.rpartition("@")
    port: str | None = None
    if hostport.startswith("["):
        address, sep, rest = hostport[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"jump host {spec!r} is not {JUMP_FORM}")
        port = rest[1:] or None
    elif hostport.count(":") == 1:
        address, port = hostport.split(":")
    else:
        address = hostport  # a name, IPv4, or a bare IPv6 address
    if port is not None and not port.isdigit():
        raise ValueError(f"jump host {spec!r}: port {port!r} is not a number")
    try:
        return JumpHost(address=address, user=user or default_user, port=int(port) if port else 22)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"jump host {spec!r} is not {JUMP_FORM} ({err['loc'][0]}: {err['msg']})") from None


def jump_from_ssh_args(value: Any, var: str, default_user: str) -> tuple[bool, JumpHost | None]:
    """The ProxyJump in an `ansible_ssh_*_args` value: (given, jump). Any other option is
    refused (ValueError): opsctl's other consumers could not apply it."""
    try:
        tokens = shlex.split(str(value or ""))
    except ValueError as exc:
        raise ValueError(f"{var}: cannot split {value!r}: {exc}") from None
    given, jump, i = False, None, 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in ("-o", "-J"):
            if i + 1 >= len(tokens):
                raise ValueError(f"{var}: {tok} without a value")
            flag, arg, i = tok, tokens[i + 1], i + 2
        elif tok[:2] in ("-o", "-J") and len(tok) > 2:
            flag, arg, i = tok[:2], tok[2:], i + 1
        else:
            raise ValueError(f"{var}: opsctl accepts only '-o ProxyJump={JUMP_FORM}' there, not {tok!r}")
        if flag == "-o":
            m = re.fullmatch(r"\s*([A-Za-z]+)\s*(?:=|\s)\s*(.*?)\s*", arg)
            if not m or m.group(1).lower() != "proxyjump":
                raise ValueError(f"{var}: opsctl accepts only '-o ProxyJump={JUMP_FORM}' there, not '-o {arg}'")
            arg = m.group(2)
        given, jump = True, parse_jump(arg, default_user)
    return given, jump


class SSHSettings(BaseModel):
    """How to reach one host over SSH; every consumer renders from this."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str
    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    key_file: Path | None = None
    known_hosts: Path | None = None
    strict_host_keys: bool = True
    connect_timeout: float = Field(5.0, gt=0)
    server_alive_interval: int = Field(15, ge=0)
    jump_host: JumpHost | None = None

    # ------------------------------------------------------------------ building

    @classmethod
    def from_inventory(cls, name: str, hostvars: Mapping[str, Any], *, key_file: Path | None = None,
                       known_hosts: Path | None = None, strict_host_keys: bool = True,
                       jump_host: str | None = None, where: str = "") -> "SSHSettings":
        """From a host's merged inventory variables (the `ansible_*` ones; the key file
        already resolved against the inventory directory) and its `opsctl.ssh_*` settings."""
        where = where or f"host {name}"
        user = str(hostvars.get("ansible_user", "root"))
        fix = ("write the jump host as ansible_ssh_common_args: \"-o ProxyJump=user@host:port\" or "
               "opsctl.ssh_jump_host: user@host:port; other SSH options are opsctl's own (see README.md)")
        from_args: list[tuple[str, JumpHost | None]] = []
        try:
            for var in SSH_ARG_VARS:
                if var in hostvars:
                    given, jump = jump_from_ssh_args(hostvars[var], var, user)
                    if given:
                        from_args.append((var, jump))
            explicit = parse_jump(jump_host, user) if jump_host is not None else None
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}", fix) from None
        jumps = [*from_args, *([("opsctl.ssh_jump_host", explicit)] if jump_host is not None else [])]
        chosen = {j for _, j in jumps if j is not None}
        if len(chosen) > 1:
            raise ConfigError(f"{where}: the jump host is given twice and differs: "
                              + ", ".join(f"{v} -> {j.spec if j else 'none'}" for v, j in jumps),
                              "keep one of them (or make them name the same user@host:port)")
        return cls(address=str(hostvars.get("ansible_host", name)), user=user,
                   port=int(hostvars.get("ansible_port", 22)), key_file=key_file, known_hosts=known_hosts,
                   strict_host_keys=strict_host_keys, jump_host=next(iter(chosen), None))

    # ------------------------------------------------------------------ facts

    @property
    def known_hosts_file(self) -> Path:
        """The known_hosts file host keys are checked against when strict."""
        return (self.known_hosts or Path("~/.ssh/known_hosts")).expanduser()

    @property
    def first_hop(self) -> tuple[str, int]:
        """Where the TCP connection goes: the jump host, else the target."""
        if self.jump_host:
            return self.jump_host.address, self.jump_host.port
        return self.address, self.port

    @property
    def target(self) -> str:
        return f"{self.user}@{_bracket(self.address)}:{self.port}"

    def describe(self) -> str:
        """user@host:port [via user@jump:port], for messages."""
        return self.target + (f" via {self.jump_host.spec}" if self.jump_host else "")

    # ------------------------------------------------------------------ OpenSSH (rsync, ansible, testinfra)

    def _host_key_options(self) -> list[str]:
        if self.strict_host_keys:
            return ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.known_hosts_file}"]
        return ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]

    def _common_options(self) -> list[str]:
        return ["-o", f"ConnectTimeout={_num(self.connect_timeout)}",
                "-o", f"ServerAliveInterval={self.server_alive_interval}", "-o", "IdentitiesOnly=yes"]

    def _cli_options(self, port: int, extra: tuple[str, ...]) -> list[str]:
        return ["-p", str(port), "-o", "BatchMode=yes", *self._common_options(),
                *(["-i", str(self.key_file)] if self.key_file else []), *self._host_key_options(), *extra]

    def proxy_command(self, *extra: str) -> str | None:
        """The ssh command that carries the connection through the jump host (None without
        one): same key, host-key policy and timeouts; `%` escaped for ssh's token expansion."""
        j = self.jump_host
        if j is None:
            return None
        argv = ["ssh", *self._cli_options(j.port, extra), "-W", f"{_bracket(self.address)}:{self.port}",
                "-l", j.user, j.address]
        return shlex.join(argv).replace("%", "%%")

    def _proxy_options(self, *extra: str) -> list[str]:
        proxy = self.proxy_command(*extra)
        return ["-o", f"ProxyCommand={proxy}"] if proxy else []

    def ssh_argv(self, *extra: str) -> list[str]:
        """`ssh` with every option, without the destination (`user@address`); `extra` options
        apply to both hops."""
        return ["ssh", *self._cli_options(self.port, extra), *self._proxy_options(*extra)]

    def rsync_rsh(self, *extra: str) -> str:
        """The `rsync -e` command string (rsync splits it honouring quotes)."""
        return shlex.join(self.ssh_argv(*extra))

    def rsync_remote(self, path: str) -> str:
        """`user@address:path`, rsync's remote form."""
        return f"{self.user}@{_bracket(self.address)}:{path}"

    def ansible_ssh_args(self) -> str:
        return shlex.join([*self._common_options(), "-o", "ControlMaster=auto", "-o", "ControlPersist=60s",
                           *self._host_key_options()])

    def ansible_common_args(self) -> str:
        """`ansible_ssh_common_args`: the jump (as a ProxyCommand), else empty."""
        return shlex.join(self._proxy_options())

    def ansible_envvars(self) -> dict[str, str]:
        return {"ANSIBLE_HOST_KEY_CHECKING": "True" if self.strict_host_keys else "False",
                "ANSIBLE_SSH_ARGS": self.ansible_ssh_args()}

    def ansible_extravars(self) -> dict[str, Any]:
        """Connection variables as extra vars (they win over the inventory's own): Ansible
        connects with exactly these (the key resolved against the inventory directory)."""
        out: dict[str, Any] = {"ansible_host": self.address, "ansible_port": self.port, "ansible_user": self.user,
                               "ansible_ssh_args": self.ansible_ssh_args(),
                               "ansible_ssh_common_args": self.ansible_common_args(),
                               "ansible_ssh_extra_args": ""}
        if self.key_file:
            out["ansible_ssh_private_key_file"] = str(self.key_file)
        return out

    def ssh_config_block(self, patterns: list[str], control_dir: Path | None = None) -> str:
        """A `Host` block of an ssh_config (testinfra's --ssh-config)."""
        def val(v: object) -> str:
            s = str(v)
            return f'"{s}"' if any(c.isspace() for c in s) else s

        lines = [f"Host {' '.join(patterns)}", f"  HostName {self.address}", f"  User {self.user}",
                 f"  Port {self.port}"]
        if self.key_file:
            lines += [f"  IdentityFile {val(self.key_file)}", "  IdentitiesOnly yes"]
        if self.strict_host_keys:
            lines += ["  StrictHostKeyChecking yes", f"  UserKnownHostsFile {val(self.known_hosts_file)}"]
        else:
            lines += ["  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null"]
        lines += ["  BatchMode yes", f"  ConnectTimeout {_num(self.connect_timeout)}",
                  f"  ServerAliveInterval {self.server_alive_interval}", "  LogLevel ERROR"]
        if self.jump_host:
            lines.append(f"  ProxyCommand {self.proxy_command()}")
        if control_dir is not None:
            lines.append(f"  ControlPath {val(control_dir)}/cm-%C")
        return "\n".join(lines)

    def testinfra_hostspec(self) -> str:
        """testinfra's host spec for the ssh backend (with ssh_config_block for the rest)."""
        return f"ssh://{self.user}@{_bracket(self.address)}:{self.port}"

    # ------------------------------------------------------------------ paramiko / fabric

    def paramiko_connect_kwargs(self) -> dict[str, Any]:
        """`SSHClient.connect` keyword arguments (fabric's connect_kwargs)."""
        t = self.connect_timeout
        kwargs: dict[str, Any] = {"timeout": t, "allow_agent": False, "look_for_keys": False,
                                  "banner_timeout": t, "auth_timeout": t}
        if self.key_file:
            kwargs["key_filename"] = str(self.key_file)
        return kwargs

    def apply_host_key_policy(self, client: Any, what: str, *, jump: bool = False) -> None:
        """Strict: the known_hosts file, unknown keys rejected. Else any key accepted (the lab).
        `jump`: the client is the jump host's (for the message's fix)."""
        import paramiko

        if self.strict_host_keys:
            known = self.known_hosts_file
            if not known.exists():
                if jump and self.jump_host:
                    scan = f"ssh-keyscan -p {self.jump_host.port} {self.jump_host.address}"
                elif self.jump_host:  # the target as the jump host sees it
                    j = self.jump_host
                    scan = f"ssh -p {j.port} {j.user}@{j.address} ssh-keyscan -p {self.port} {self.address}"
                else:
                    scan = f"ssh-keyscan -p {self.port} {self.address}"
                raise HostError(f"known_hosts file {known} does not exist, so {what}'s key cannot be verified",
                                f"add the host key: {scan} >> {known}")
            client.load_host_keys(str(known))
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())

    def fabric_connection(self, name: str = "host") -> "FabricConnection":
        """A fabric Connection (not opened) with these settings; through the jump host, its
        gateway is a Connection to the jump (paramiko's direct-tcpip channel is the sock)."""
        from fabric import Connection as FabricConnection

        gateway = None
        if self.jump_host:
            j = self.jump_host
            gateway = FabricConnection(j.address, user=j.user, port=j.port,
                                       connect_kwargs=self.paramiko_connect_kwargs())
            self.apply_host_key_policy(gateway.client, f"jump host {j.spec}", jump=True)
        conn = FabricConnection(self.address, user=self.user, port=self.port,
                                connect_kwargs=self.paramiko_connect_kwargs(), gateway=gateway)
        self.apply_host_key_policy(conn.client, name)
        return conn
