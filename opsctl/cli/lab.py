"""opsctl lab: boot, inspect, reach and tear down the local lab host; inject faults.

Thin: parse, call opsctl.lab, print. Failures are LabError / ConfigError.
"""
from __future__ import annotations

import os
from typing import List, Optional

import typer

from opsctl.cli import _output
from opsctl.errors import LabError

lab_app = typer.Typer(
    name="lab",
    help=("The local lab host: a real systemd machine (systemd-nspawn over a throw-away overlay of /, "
          "own network namespace, real SSH) running an SGLang 0.5.23 emulator instead of GPUs. Needs root.\n\n"
          "Up to 5 hosts (--hosts): lab1 (10.203.9.2, the single-host lab, inventories/lab), lab2 "
          "(10.203.9.6), lab3 (10.203.9.10), lab4 (10.203.9.14), lab5 (10.203.9.18); inventories/lab-fleet holds lab1-lab3.\n\n"
          "Examples:\n\n"
          "  opsctl lab up\n\n"
          "  opsctl lab up --hosts 3\n\n"
          "  opsctl lab ssh -- systemctl status sglang-k26\n\n"
          "  opsctl lab ssh --host lab2 -- hostname\n\n"
          "  opsctl lab fault set accept-collapse\n\n"
          "  opsctl lab fault set port-holder --host lab3\n\n"
          "  opsctl lab down"),
    no_args_is_help=True,
    rich_markup_mode=None,
)
fault_app = typer.Typer(name="fault", help="Inject faults into the lab host (emulator faults apply at the next "
                        "service start). See docs/lab.md.", no_args_is_help=True, rich_markup_mode=None)
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON on stdout.")
HOST_HELP = "Which lab host: lab (= lab1), lab2, lab3, lab4, lab5 (or 1-5). Default: lab1."


def _say(msg: str) -> None:
    _output.info(msg)


@lab_app.command("up")
def up(json_out: bool = JsonOpt,
       timeout: float = typer.Option(90.0, "--timeout", help="Seconds to wait for SSH."),
       hosts: int = typer.Option(1, "--hosts", metavar="N",
                                 help="Run N lab hosts (1-5): lab1 10.203.9.2 (the single-host lab), lab2 "
                                      "10.203.9.6, lab3 10.203.9.10, lab4 10.203.9.14, lab5 10.203.9.18, each its own systemd "
                                      "container. 'opsctl lab up --hosts 3' + '-i inventories/lab-fleet' gives "
                                      "a 3-host fleet. Hosts already up are kept; hosts above N are left as "
                                      "they are.")) -> None:
    """Boot the lab host(s) (idempotent; cleans up a crashed earlier run; installs missing Debian packages).

    Examples: opsctl lab up    opsctl lab up --hosts 3
    """
    from opsctl import lab
    from opsctl.lab import holder
    from opsctl.lab.host import check_hosts

    _output.set_json(json_out)
    check_hosts(hosts)
    lab.require_root()
    with holder.session_lock("bring the lab up"):
        current = holder.read_holder()
        if holder.held_by_other(current) and lab.status().running:
            raise LabError(f"the lab is already up, held by {holder.describe(current)}",
                           "use it as it is, or ask its holder")
        st = lab.up(say=_say, timeout_s=timeout, hosts=hosts)
        holder.write_holder("opsctl lab up")
    fleet = lab.fleet_status(probe_ssh=False) if hosts > 1 else []
    if json_out:
        _output.emit_json({"ok": True, **st.as_dict(), "hosts": [f.as_dict() for f in fleet] or [st.as_dict()]})
    elif hosts == 1:
        _output.info(f"lab host: root@{st.address} (key {st.key_file}); inventory: inventories/lab\n"
                     f"  ssh: opsctl lab ssh   or   {st.ssh_command}")
    else:
        _output.info("lab hosts: " + ", ".join(f"{f.host} root@{f.address}" for f in fleet if f.running)
                     + f" (key {st.key_file}); inventory: inventories/lab-fleet (lab1-lab3)\n"
                     "  ssh: opsctl lab ssh --host lab2")


@lab_app.command("down")
def down(json_out: bool = JsonOpt,
         force: bool = typer.Option(False, "--force", help="Take it down although another login session brought "
                                    "it up (never while a test session holds the lab's lock)."),
         hosts: Optional[List[str]] = typer.Option(None, "--host", help="Halt only this lab host (repeatable: "
                                                   "--host lab2 --host lab3); default: every host.")) -> None:
    """Halt the lab host(s) and remove their namespaces, veths, cgroups and mounts.

    Refused (exit 7, naming the holder) when another session brought the lab up or a test
    session is using it.

    Examples: opsctl lab down    opsctl lab down --host lab2 --host lab3
    """
    from opsctl import lab
    from opsctl.lab import holder

    _output.set_json(json_out)
    nodes = [lab.resolve_node(h).index for h in hosts] if hosts else None
    lab.require_root()
    with holder.session_lock("take the lab down"):
        holder.check_may_take_down(force)
        left = lab.down(say=_say, nodes=nodes)
        if nodes is None or not lab.fleet_status(probe_ssh=False):
            holder.clear_holder()
    if json_out:
        _output.emit_json({"ok": True, "leftovers": left})
    elif nodes:
        _output.info(f"lab: {', '.join(lab.resolve_node(n).name for n in nodes)} down; nothing of them left behind")
    else:
        _output.info("lab: down; nothing left behind")


@lab_app.command("status")
def status(json_out: bool = JsonOpt) -> None:
    """Is the lab up, does each host answer SSH, what is left on this machine (one row per host).

    --json: lab1's fields at the top level (as with one host), "hosts": one object per host.
    """
    from opsctl import lab
    from opsctl.lab import holder

    _output.set_json(json_out)
    st = lab.status()
    others = [f for f in lab.fleet_status() if f.node != 1]
    fleet = ([st] if st.running or lab.node_leftovers(1) else []) + others
    any_up = any(f.running for f in fleet)
    left = lab.leftovers() if not any_up else [x for f in fleet if not f.running for x in lab.node_leftovers(f.node)]
    held = holder.read_holder() if any_up else None
    if json_out:
        hosts = [{**f.as_dict(), "leftovers": [] if f.running else lab.node_leftovers(f.node)} for f in fleet]
        _output.emit_json({**st.as_dict(), "leftovers": left, "holder": held, "hosts": hosts})
        return
    if not any_up:
        _output.info("lab: down" + (f"; leftovers: {'; '.join(left)} (run 'opsctl lab up' or 'down' to clean)"
                                     if left else ""))
        return
    rows = [[f.host, f.address, f.hostname, "up" if f.running else "DOWN (leftovers)", f.pid or "",
             ("answers" if f.ssh else "does NOT answer") if f.running else "", f.system_state or ""]
            for f in fleet]
    _output.table(f"lab hosts ({sum(f.running for f in fleet)} up)",
                  ["host", "address", "hostname", "state", "nspawn pid", "ssh", "system"], rows)
    first = next(f for f in fleet if f.running)
    _output.info(f"  ssh: {'opsctl lab ssh' if first.node == 1 else 'opsctl lab ssh --host ' + first.host}"
                 f"   or   {first.ssh_command}"
                 + (f"\n  leftovers: {'; '.join(left)} (run 'opsctl lab up' or 'down' to clean)" if left else "")
                 + (f"\n  held by: {holder.describe(held)}" if held else ""))


@lab_app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(ctx: typer.Context,
        host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP)) -> None:
    """SSH into a lab host as root (extra arguments run as a command).

    Examples: opsctl lab ssh    opsctl lab ssh --host lab2 -- hostname
    """
    from opsctl import lab
    from opsctl.errors import LabError

    node = lab.resolve_node(host)
    st = lab.status(probe_ssh=False, node=node)
    if not st.running:
        if node.index == 1:
            raise LabError("the lab is not up", "run 'opsctl lab up'")
        raise LabError(f"lab host {node.name} is not up", f"run 'opsctl lab up --hosts {node.index}'")
    cmd = " ".join(ctx.args) if ctx.args else None
    argv = lab.ssh_argv(cmd, tty=cmd is None, node=node)
    os.execvp(argv[0], argv)


@fault_app.command("set")
def fault_set(name: str = typer.Argument(..., help="Fault name (see 'opsctl lab fault list')."),
              params: Optional[List[str]] = typer.Argument(None, help="key=value parameters."),
              host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP),
              json_out: bool = JsonOpt) -> None:
    """Activate a fault on a lab host (lab1 unless --host).

    Example: opsctl lab fault set crash-after requests=3 --host lab2
    """
    from opsctl import lab
    from opsctl.lab import faults

    _output.set_json(json_out)
    key = faults.normalise(name)
    node = lab.resolve_node(host)
    effective = lab.set_fault(key, host=node.index, **faults.parse_params(params or []))
    where = "" if host is None else f" on {node.name}"
    if json_out:
        _output.emit_json({"ok": True, "fault": key, "params": effective, "host": node.name})
    else:
        when = "now" if key in faults.HOST_CONDITIONS else "at the next start of the service"
        _output.info(f"lab: fault {key} set{where} ({effective}); takes effect {when}")


@fault_app.command("clear")
def fault_clear(name: Optional[str] = typer.Argument(None, help="Fault to clear; all when omitted."),
                host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP),
                json_out: bool = JsonOpt) -> None:
    """Clear one fault or all of them (on lab1 unless --host)."""
    from opsctl import lab

    _output.set_json(json_out)
    node = lab.resolve_node(host)
    cleared = lab.clear_fault(name, host=node.index)
    where = "" if host is None else f" on {node.name}"
    if json_out:
        _output.emit_json({"ok": True, "cleared": cleared, "host": node.name})
    else:
        _output.info(f"lab: cleared {', '.join(cleared) or 'nothing'}{where}")


@fault_app.command("list")
def fault_list(host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP),
               json_out: bool = JsonOpt) -> None:
    """Active faults on a lab host (lab1 unless --host), and all available ones."""
    from opsctl import lab

    _output.set_json(json_out)
    info = lab.list_faults(host=lab.resolve_node(host).index)
    if json_out:
        _output.emit_json(info)
        return
    rows = [[("ACTIVE" if k in info["active"] else ""), k.replace("_", "-"),
             " ".join(f"{p}={v}" for p, v in (info["active"].get(k) or d["params"]).items()), d["symptom"]]
            for k, d in info["available"].items()]
    _output.table(f"lab faults on {info['host']} ({info['file']})", ["", "fault", "params", "symptom"], rows)


lab_app.add_typer(fault_app, name="fault")


def register(app: typer.Typer) -> None:
    app.add_typer(lab_app, name="lab")
