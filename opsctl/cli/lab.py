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
          "Examples:\n\n"
          "  opsctl lab up\n\n"
          "  opsctl lab ssh -- systemctl status sglang-k26\n\n"
          "  opsctl lab fault set accept-collapse\n\n"
          "  opsctl lab down"),
    no_args_is_help=True,
    rich_markup_mode=None,
)
fault_app = typer.Typer(name="fault", help="Inject faults into the lab host (emulator faults apply at the next "
                        "service start). See docs/lab.md.", no_args_is_help=True, rich_markup_mode=None)
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON on stdout.")


def _say(msg: str) -> None:
    _output.info(msg)


@lab_app.command("up")
def up(json_out: bool = JsonOpt,
       timeout: float = typer.Option(90.0, "--timeout", help="Seconds to wait for SSH.")) -> None:
    """Boot the lab host (idempotent; cleans up a crashed earlier run; installs missing Debian packages)."""
    from opsctl import lab
    from opsctl.lab import holder

    _output.set_json(json_out)
    lab.require_root()
    with holder.session_lock("bring the lab up"):
        current = holder.read_holder()
        if holder.held_by_other(current) and lab.status().running:
            raise LabError(f"the lab is already up, held by {holder.describe(current)}",
                           "use it as it is, or ask its holder")
        st = lab.up(say=_say, timeout_s=timeout)
        holder.write_holder("opsctl lab up")
    if json_out:
        _output.emit_json({"ok": True, **st.as_dict()})
    else:
        _output.info(f"lab host: root@{st.address} (key {st.key_file}); inventory: inventories/lab\n"
                     f"  ssh: opsctl lab ssh   or   {st.ssh_command}")


@lab_app.command("down")
def down(json_out: bool = JsonOpt,
         force: bool = typer.Option(False, "--force", help="Take it down although another login session brought "
                                    "it up (never while a test session holds the lab's lock).")) -> None:
    """Halt the lab host and remove its namespace, veth, cgroups and mounts.

    Refused (exit 7, naming the holder) when another session brought the lab up or a test
    session is using it.

    Example: opsctl lab down
    """
    from opsctl import lab
    from opsctl.lab import holder

    _output.set_json(json_out)
    lab.require_root()
    with holder.session_lock("take the lab down"):
        holder.check_may_take_down(force)
        left = lab.down(say=_say)
        holder.clear_holder()
    if json_out:
        _output.emit_json({"ok": True, "leftovers": left})
    else:
        _output.info("lab: down; nothing left behind")


@lab_app.command("status")
def status(json_out: bool = JsonOpt) -> None:
    """Is the lab up, does it answer SSH, what is left on this machine."""
    from opsctl import lab
    from opsctl.lab import holder

    _output.set_json(json_out)
    st = lab.status()
    left = [] if st.running else lab.leftovers()
    held = holder.read_holder() if st.running else None
    if json_out:
        _output.emit_json({**st.as_dict(), "leftovers": left, "holder": held})
        return
    if st.running:
        _output.info(f"lab: up (nspawn pid {st.pid}), ssh {'answers' if st.ssh else 'does NOT answer'}, "
                     f"system {st.system_state or '?'}\n  ssh: {st.ssh_command}"
                     + (f"\n  held by: {holder.describe(held)}" if held else ""))
    else:
        _output.info("lab: down" + (f"; leftovers: {'; '.join(left)} (run 'opsctl lab up' or 'down' to clean)"
                                     if left else ""))


@lab_app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(ctx: typer.Context) -> None:
    """SSH into the lab host as root (extra arguments run as a command)."""
    from opsctl import lab
    from opsctl.errors import LabError

    st = lab.status(probe_ssh=False)
    if not st.running:
        raise LabError("the lab is not up", "run 'opsctl lab up'")
    cmd = " ".join(ctx.args) if ctx.args else None
    argv = lab.ssh_argv(cmd, tty=cmd is None)
    os.execvp(argv[0], argv)


@fault_app.command("set")
def fault_set(name: str = typer.Argument(..., help="Fault name (see 'opsctl lab fault list')."),
              params: Optional[List[str]] = typer.Argument(None, help="key=value parameters."),
              json_out: bool = JsonOpt) -> None:
    """Activate a fault on the lab host."""
    from opsctl import lab
    from opsctl.lab import faults

    _output.set_json(json_out)
    key = faults.normalise(name)
    effective = lab.set_fault(key, **faults.parse_params(params or []))
    if json_out:
        _output.emit_json({"ok": True, "fault": key, "params": effective})
    else:
        when = "now" if key in faults.HOST_CONDITIONS else "at the next start of the service"
        _output.info(f"lab: fault {key} set ({effective}); takes effect {when}")


@fault_app.command("clear")
def fault_clear(name: Optional[str] = typer.Argument(None, help="Fault to clear; all when omitted."),
                json_out: bool = JsonOpt) -> None:
    """Clear one fault or all of them."""
    from opsctl import lab

    _output.set_json(json_out)
    cleared = lab.clear_fault(name)
    if json_out:
        _output.emit_json({"ok": True, "cleared": cleared})
    else:
        _output.info(f"lab: cleared {', '.join(cleared) or 'nothing'}")


@fault_app.command("list")
def fault_list(json_out: bool = JsonOpt) -> None:
    """Active faults on the lab host, and all available ones."""
    from opsctl import lab

    _output.set_json(json_out)
    info = lab.list_faults()
    if json_out:
        _output.emit_json(info)
        return
    rows = [[("ACTIVE" if k in info["active"] else ""), k.replace("_", "-"),
             " ".join(f"{p}={v}" for p, v in (info["active"].get(k) or d["params"]).items()), d["symptom"]]
            for k, d in info["available"].items()]
    _output.table(f"lab faults ({info['file']})", ["", "fault", "params", "symptom"], rows)


lab_app.add_typer(fault_app, name="fault")


def register(app: typer.Typer) -> None:
    app.add_typer(lab_app, name="lab")
