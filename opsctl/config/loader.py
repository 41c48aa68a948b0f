"""The inventory loader: Ansible's own layout (hosts.yml, group_vars/, host_vars/) read in
Ansible's variable precedence (groups sorted as Ansible's sort_groups does: by depth, priority and
name; a variable set again replaces the earlier value whole, a mapping included, as
hash_behaviour=replace does: docs/inventory.md), then each host's `opsctl:` audited (audit.py)
and validated into a HostConfig (models.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opsctl.config.audit import _Head, _check_keys
from opsctl.config.located import _Located, _mapping, _read_yaml
from opsctl.config.models import HostConfig, HostSettings, Inventory, Profile, watch_window_problem
from opsctl.config.profiles import BUILTIN_PROFILES, profile_names
from opsctl.errors import ConfigError
from opsctl.gate.decide import GatePolicy
from opsctl.host.ssh import SSHSettings


def _update(base: dict, extra: dict) -> dict:
    """Ansible's `combine_vars` (hash_behaviour=replace, its default): a variable set again
    replaces the earlier value whole, a mapping included."""
    out = _Located(base)
    out.where = dict(getattr(base, "where", {}))
    for key, value in extra.items():
        out[key] = value
        if key in getattr(extra, "where", {}):
            out.where[key] = extra.where[key]
        else:
            out.where.pop(key, None)
    return out


_VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")  # Ansible's order (DataLoader.find_vars_files)


def _vars_paths(directory: Path, name: str) -> list[Path]:
    """The files Ansible's host_group_vars plugin reads for a group or host: the first of
    NAME, NAME.yml, NAME.yaml, NAME.json that exists; a directory gives every file in it
    (sorted, recursively, hidden and backup files skipped)."""
    def in_dir(d: Path) -> list[Path]:
        out: list[Path] = []
        for p in sorted(d.iterdir(), key=lambda p: p.name):
            if p.name.startswith(".") or p.name.endswith("~"):
                continue
            if p.is_dir() and not p.suffix:
                out += in_dir(p)
            elif p.is_file() and (not p.suffix or p.suffix in _VARS_EXTENSIONS):
                out.append(p)
        return out

    if not directory.is_dir():
        return []
    for ext in _VARS_EXTENSIONS:
        p = directory / f"{name}{ext}"
        if p.exists():
            return in_dir(p) if p.is_dir() else [p]
    return []


def _vars_files(directory: Path, name: str) -> list[tuple[str, dict]]:
    return [(str(p), _mapping(_read_yaml(p), str(p))) for p in _vars_paths(directory, name)]


class _Groups:
    """What hosts.yml says about groups and hosts, as Ansible's YAML inventory plugin reads it."""

    def __init__(self) -> None:
        self.hosts: dict[str, list[str]] = {}      # group -> hosts of its subtree (for --limit), file order
        self.parents: dict[str, set[str]] = {}
        self.vars: dict[str, dict] = {}            # group -> its inline `vars:` (a key set again replaces)
        self.priority: dict[str, int] = {}         # ansible_group_priority (inline vars only, as in Ansible)
        self.direct: dict[str, list[str]] = {}     # host -> groups that list it under `hosts:`
        self.host_vars: dict[str, dict] = {}       # host -> its inline variables
        self.order: list[str] = []                 # hosts in file order

    def depth(self, group: str, _seen: tuple[str, ...] = ()) -> int:
        """Ansible's Group.depth: the longest chain of parents up to `all` (0)."""
        if group == "all" or group in _seen:
            return 0
        return max((self.depth(p, (*_seen, group)) + 1 for p in self.parents.get(group, ())), default=1)

    def of_host(self, host: str) -> list[str]:
        """The host's groups but `all` (each group listing it and their ancestors; `ungrouped`
        when none), in Ansible's merge order (`sort_groups`: depth, then priority, then name)."""
        found: set[str] = set()
        todo = list(self.direct.get(host, []))
        while todo:
            g = todo.pop()
            if g in found or g == "all":
                continue
            found.add(g)
            todo += list(self.parents.get(g, ()))
        if not found:
            found = {"ungrouped"}
        return sorted(found, key=lambda g: (self.depth(g), self.priority.get(g, 1), g))


def _walk_groups(name: str, node: dict, where: str, parent: str | None, lineage: tuple[str, ...], g: _Groups) -> None:
    node = _mapping(node, where)
    unknown = set(node) - {"hosts", "children", "vars"}
    if unknown:
        at = getattr(node, "where", {}).get(sorted(unknown, key=str)[0])
        raise ConfigError(f"{at + ': ' if at else ''}{where}: unknown key(s) {sorted(unknown, key=str)} "
                          f"in group {name!r}", "a group has only 'hosts', 'children' and 'vars'")
    if parent is not None:
        g.parents.setdefault(name, set()).add(parent)
    gvars = _mapping(node.get("vars"), f"{where}.vars")
    if "ansible_group_priority" in gvars:
        try:
            g.priority[name] = int(gvars["ansible_group_priority"])
        except (TypeError, ValueError):
            at = getattr(gvars, "where", {}).get("ansible_group_priority")
            raise ConfigError(f"{at + ': ' if at else ''}{where}.vars.ansible_group_priority: not an integer",
                              "give ansible_group_priority a whole number (Ansible's default is 1)") from None
    own = _Located({k: v for k, v in gvars.items() if k != "ansible_group_priority"})
    own.where = {k: w for k, w in getattr(gvars, "where", {}).items() if k != "ansible_group_priority"}
    g.vars[name] = _update(g.vars.get(name, _Located()), own)
    lineage = (*lineage, name)
    for host, hvars in _mapping(node.get("hosts"), f"{where}.hosts").items():
        host = str(host)
        if host not in g.order:
            g.order.append(host)
        for grp in lineage:
            if host not in g.hosts.setdefault(grp, []):
                g.hosts[grp].append(host)
        if name not in g.direct.setdefault(host, []):
            g.direct[host].append(name)
        g.host_vars[host] = _update(g.host_vars.get(host, _Located()), _mapping(hvars, f"{where}.hosts.{host}"))
    for child, cnode in _mapping(node.get("children"), f"{where}.children").items():
        _walk_groups(str(child), cnode, f"{where}.children.{child}", name, lineage, g)


def _host_sources(host: str, g: _Groups, directory: Path, hosts_file: Path) -> list[tuple[str, dict]]:
    """(where, variables) for one host, lowest precedence first, as Ansible's VariableManager
    takes them: `all`'s inline vars, the other groups' inline vars, group_vars/all, the other
    groups' group_vars (groups in `sort_groups` order each time), then the host's inline
    variables and its host_vars."""
    groups = g.of_host(host)
    gv_dir, hv_dir = directory / "group_vars", directory / "host_vars"
    out: list[tuple[str, dict]] = [(f"{hosts_file}: group {grp} vars", g.vars.get(grp, {})) for grp in ["all", *groups]]
    for grp in ["all", *groups]:
        out += _vars_files(gv_dir, grp)
    out.append((f"{hosts_file}: host {host}", g.host_vars.get(host, {})))
    out += _vars_files(hv_dir, host)
    return [(w, v) for w, v in out if v]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _hidden_keys(lower: Any, winner: Any, prefix: str = "") -> list[str]:
    """Keys (dotted) a deep merge of `lower` under `winner` would add: what Ansible drops."""
    if not isinstance(lower, dict) or not isinstance(winner, dict):
        return []
    out = []
    for k, v in lower.items():
        if k not in winner:
            out.append(f"{prefix}{k}")
        else:
            out += _hidden_keys(v, winner[k], f"{prefix}{k}.")
    return out


def _opsctl_of(host: str, sources: list[tuple[str, dict]], directory: Path) -> tuple[dict | None, str | None]:
    """The host's `opsctl:` mapping as Ansible resolves it (the highest-precedence one, whole),
    refused where an opsctl that deep-merged the levels would read something else (after its
    own keys are checked: a typo there is the more useful error)."""
    defined = [(w, v["opsctl"]) for w, v in sources if "opsctl" in v]
    if not defined:
        return None, None
    where, winner = defined[-1]
    hidden: list[str] = []
    lower_at: list[str] = []
    for w, v in defined[:-1]:
        keys = _hidden_keys(_plain(v), _plain(winner))
        if keys:
            hidden += [k for k in keys if k not in hidden]
            lower_at.append(w)
    if hidden:
        if isinstance(winner, dict):
            _check_keys(winner, HostSettings, (), _Head(directory, host, winner))
        line = getattr(sources[[s[0] for s in sources].index(where)][1], "where", {}).get("opsctl", where)
        shown = ", ".join(hidden[:4]) + (f" and {len(hidden) - 4} more" if len(hidden) > 4 else "")
        raise ConfigError(
            f"{line}: host {host}: this opsctl: mapping replaces the one in {' and '.join(lower_at)} whole, as "
            f"Ansible does (a mapping set at two levels is replaced, never merged): {shown} set there would not "
            f"apply to {host}",
            f"write host {host}'s complete opsctl: mapping in {where} (the other's keys with your changes), or "
            f"remove opsctl: from it (docs/inventory.md)", details={"host": host, "replaced": lower_at, "by": where,
                                                                  "keys_not_applied": hidden})
    return winner, where


def load_inventory(path: str | Path) -> Inventory:
    """Load and validate an inventory directory (or a hosts.yml file inside one).

    Variables resolve as Ansible's own VariableManager resolves them (docs/inventory.md):
    groups in `sort_groups` order (depth, then ansible_group_priority, then name), inline
    `vars:` of hosts.yml below group_vars/, host variables last, and a variable set at two
    levels replaced whole - `opsctl:` included, which is refused when a deep merge would
    read it differently."""
    path = Path(path)
    if path.is_file():
        hosts_file, directory = path, path.parent
    else:
        directory = path
        hosts_file = next((directory / n for n in ("hosts.yml", "hosts.yaml") if (directory / n).is_file()), None)
        if hosts_file is None:
            raise ConfigError(f"no inventory at {path} (expected {path}/hosts.yml)",
                              "pass --inventory DIR pointing at e.g. inventories/lab")
    top = _mapping(_read_yaml(hosts_file), str(hosts_file))
    if "all" not in top:
        raise ConfigError(f"{hosts_file}: the top-level key must be 'all'", "see inventories/lab/hosts.yml")
    g = _Groups()
    _walk_groups("all", top["all"], f"{hosts_file.name}:all", None, (), g)
    for name in top:  # Ansible reads a top-level group beside `all` as a child of `all`
        if name != "all":
            _walk_groups(str(name), top[name], f"{hosts_file.name}:{name}", "all", ("all",), g)
    if not g.order:
        raise ConfigError(f"{hosts_file} defines no hosts", "add a host under all.children.<group>.hosts")

    hosts: dict[str, HostConfig] = {}
    for host in g.order:
        sources = _host_sources(host, g, directory, hosts_file)
        merged: dict = _Located()
        for _, layer in sources:
            merged = _update(merged, layer)
        opsctl, _ = _opsctl_of(host, sources, directory)
        if opsctl is not None:
            merged["opsctl"] = opsctl
        member_of = tuple(grp for grp in g.hosts if host in g.hosts[grp] and grp != "all")
        hosts[host] = _host_config(host, member_of, merged, directory)
    return Inventory(path=directory, name=directory.name, hosts=hosts,
                     groups={grp: tuple(h) for grp, h in g.hosts.items()})


def _resolve_local(directory: Path, value: Any) -> Any:
    if value in (None, ""):
        return None
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else (directory / p).resolve()


_SSH_VARS = {"address": "ansible_host", "user": "ansible_user", "port": "ansible_port",
             "key_file": "ansible_ssh_private_key_file"}


def _host_config(name: str, groups: tuple[str, ...], merged: dict, directory: Path) -> HostConfig:
    raw = _mapping(merged.get("opsctl"), f"host {name}: opsctl")
    head = _Head(directory, name, raw)
    fix = f"set it in {directory}/group_vars/all.yml or {directory}/host_vars/{name}.yml"
    _check_keys(raw, HostSettings, (), head)
    settings = dict(raw)
    try:
        for section, key in (("drafter", "source"), ("runtime", "wheelhouse"), ("runtime", "runtime_wheel"),
                             ("runtime", "runtime_source")):
            sec = settings.get(section)
            if isinstance(sec, dict) and key in sec:
                settings[section] = {**sec, key: _resolve_local(directory, sec[key])}
        for key in ("ssh_known_hosts", "secrets_file"):
            if key in settings:
                settings[key] = _resolve_local(directory, settings[key])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{head.at(None)}: {exc}", fix) from None
    if isinstance(settings.get("gate"), dict):
        try:
            settings["gate"] = GatePolicy.model_validate(settings["gate"])
        except ValidationError as exc:
            raise head.invalid(exc, ("gate",), "fix the gate policy (opsctl.gate) on that line") from None
        except ConfigError as exc:  # the workload mix (opsctl/gate/workloads.py)
            raise ConfigError(f"{head.of('gate', 'workloads')}: opsctl.gate.workloads: {exc.problem}",
                              exc.fix) from None
    try:
        parsed = HostSettings.model_validate(settings)
    except ValidationError as exc:
        raise head.invalid(exc, (), fix) from None
    try:
        ssh = SSHSettings.from_inventory(
            name, merged, key_file=_resolve_local(directory, merged.get("ansible_ssh_private_key_file")),
            known_hosts=parsed.ssh_known_hosts, strict_host_keys=parsed.ssh_strict_host_keys,
            jump_host=parsed.ssh_jump_host, where=head.at(None))
    except ValidationError as exc:
        err = exc.errors()[0]
        var = _SSH_VARS.get(str(err["loc"][0]) if err["loc"] else "", "ssh")
        at = head.at(getattr(merged, "where", {}).get(var))
        raise ConfigError(f"{at}: {var}: {err['msg']}", f"fix {var} in {directory}/hosts.yml or host_vars/") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{head.at(None)}: {exc}", fix) from None
    host = HostConfig(name=name, groups=groups, ssh=ssh, settings=parsed)
    known = profile_names(parsed.profiles)
    # profile overrides are validated now, not at deploy time
    for pname in parsed.profiles:
        data = {**BUILTIN_PROFILES.get(pname, {}), **parsed.profiles[pname]}
        if pname not in BUILTIN_PROFILES and "kind" not in data:
            import difflib

            close = difflib.get_close_matches(pname, list(BUILTIN_PROFILES), n=1, cutoff=0.6)
            raise ConfigError(f"{head.of('profiles', pname)}: opsctl.profiles.{pname}: not a built-in profile"
                              + (f": did you mean {close[0]!r}?" if close else " and no kind given"),
                              f"rename it to {close[0]!r}" if close else
                              f"override one of {', '.join(BUILTIN_PROFILES)}, or give a new profile a kind "
                              "(autoregressive, dflash, ddtree)")
        if "trial_set" in parsed.profiles[pname]:
            raise ConfigError(f"{head.of('profiles', pname, 'trial_set')}: opsctl.profiles.{pname}.trial_set is "
                              "set by 'opsctl tune' for its trial release, not in the inventory",
                              "remove it; 'opsctl tune ddtree --budgets 4,8,16' captures the candidates at one start")
        if data.get("kind") == "ddtree" and "budget" not in data:
            data["budget"] = 1  # budget comes from the CLI; validate the rest
        try:
            Profile(name=pname, **data)
        except ValidationError as exc:
            raise head.invalid(exc, ("profiles", pname), fix) from None
    if parsed.baseline_profile not in known:
        raise ConfigError(f"{head.of('baseline_profile')}: baseline_profile {parsed.baseline_profile!r} "
                          "is not a known profile", f"use one of: {', '.join(known)}")
    unknown_rules = sorted(set(parsed.watch.rules) - set(known))
    if unknown_rules:
        import difflib

        close = difflib.get_close_matches(unknown_rules[0], known, n=1, cutoff=0.6)
        raise ConfigError(f"{head.of('watch', 'rules', unknown_rules[0])}: opsctl.watch.rules: unknown profile(s) "
                          f"{', '.join(unknown_rules)}" + (f": did you mean {close[0]!r}?" if close else ""),
                          f"use one of: {', '.join(known)}")
    short = watch_window_problem(parsed)
    if short is not None:
        loc, problem, fix_ = short
        raise ConfigError(f"{head.of(*loc)}: {problem}", fix_)
    baseline = {**BUILTIN_PROFILES.get(parsed.baseline_profile, {}), **parsed.profiles.get(parsed.baseline_profile, {})}
    if baseline.get("kind") != "autoregressive":
        raise ConfigError(f"{head.of('baseline_profile')}: baseline_profile {parsed.baseline_profile!r} "
                          "is not autoregressive",
                          "the rollback baseline must be ar-tp8, ar-ep8 or another autoregressive profile")
    return host
