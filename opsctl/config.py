"""Typed configuration: inventory (Ansible layout), host facts, deployment profiles.

The inventory directory is Ansible's own (`hosts.yml`, `group_vars/`, `host_vars/`),
so one set of files drives both ansible-runner and opsctl. opsctl's settings live
under one `opsctl:` mapping, deep-merged all -> groups -> host; SSH facts come from
the usual `ansible_*` variables.
"""
from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from opsctl.errors import ConfigError
from opsctl.host.ssh import SSHSettings

ProfileKind = Literal["autoregressive", "dflash", "ddtree"]
MAX_BUDGET = 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- profiles


class Profile(_Strict):
    """One way of running the server, as data. `verify_width` is what graph capture
    must be sized for: 1 (autoregressive), block size (dflash), budget + 1 (ddtree)."""

    name: str
    kind: ProfileKind
    description: str = ""
    tp_size: int = Field(8, ge=1)
    ep_size: int = Field(1, ge=1)
    dp_size: int = Field(1, ge=1)
    block_size: int | None = Field(None, ge=2, description="DFlash drafter block size")
    budget: int | None = Field(None, ge=1, le=MAX_BUDGET, description="DDTree node budget (root excluded)")
    attention_backend: str = "flashinfer"
    mem_fraction_static: float = Field(0.85, gt=0, lt=1)
    cuda_graph_max_bs: int = Field(32, ge=1, description="largest decode batch captured in a CUDA graph")
    max_running_requests: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1, description="concurrency the site serves; graphs must cover it")
    decode_log_interval: int = Field(40, ge=1)
    readiness_timeout_s: int = Field(1800, ge=5)
    accept_len_floor: float | None = Field(None, ge=1.0)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _kind_fields(self) -> "Profile":
        if self.kind in ("dflash", "ddtree") and self.block_size is None:
            raise ValueError(f"profile {self.name}: a {self.kind} profile needs block_size")
        if self.kind == "ddtree" and self.budget is None:
            raise ValueError(f"profile {self.name}: a ddtree profile needs a budget")
        if self.kind != "ddtree" and self.budget is not None:
            raise ValueError(f"profile {self.name}: budget only applies to ddtree profiles")
        return self

    @property
    def speculative(self) -> bool:
        return self.kind != "autoregressive"

    @property
    def verify_width(self) -> int:
        if self.kind == "ddtree":
            assert self.budget is not None
            return self.budget + 1  # the root/bonus token is not counted in the budget
        if self.kind == "dflash":
            assert self.block_size is not None
            return self.block_size
        return 1

    @property
    def effective_max_concurrency(self) -> int:
        return self.max_concurrency or self.cuda_graph_max_bs

    @property
    def label(self) -> str:
        return f"{self.name} --budget {self.budget}" if self.kind == "ddtree" else self.name

    @property
    def slug(self) -> str:
        return f"{self.name}-b{self.budget}" if self.kind == "ddtree" else self.name


BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "ar-tp8": {"kind": "autoregressive", "tp_size": 8,
               "description": "autoregressive baseline, tensor parallel over 8 GPUs"},
    "ar-ep8": {"kind": "autoregressive", "tp_size": 8, "ep_size": 8,
               "description": "autoregressive baseline, expert parallel MoE over 8 GPUs (no MoE all-reduce)"},
    "dflash": {"kind": "dflash", "tp_size": 8, "block_size": 8,
               "description": "DFlash block-diffusion drafter, linear verify of block_size tokens"},
    "ddtree": {"kind": "ddtree", "tp_size": 8, "block_size": 8, "cuda_graph_max_bs": 32,
               "description": "DDTree: best-first draft tree of --budget nodes from the DFlash drafter, tree verify"},
}


# --------------------------------------------------------------------------- host facts


SSHFacts = SSHSettings  # HostConfig.ssh: the one SSH configuration (opsctl/host/ssh.py)


class GPUFacts(_Strict):
    model: str
    count: int = Field(ge=1)
    memory_mib: int | None = Field(None, ge=1)
    driver_min: str | None = None
    driver_max: str | None = None
    min_free_mib: int = Field(80000, ge=0)


class ModelFacts(_Strict):
    path: PurePosixPath = Field(description="target model directory on the host; never copied")
    name: str = Field(description="served model name")


class DrafterFacts(_Strict):
    source: Path = Field(description="drafter weights directory on the controller")
    name: str = "drafter"


class RuntimeFacts(_Strict):
    sglang_version: str = "0.5.23"
    wheelhouse: Path = Field(description="controller directory of wheels for the base environment (offline install)")
    base_requirements: tuple[str, ...] = ("sglang==0.5.23",)
    python_version: str = Field("3.11", pattern=r"^3\.\d{1,2}$",
                                description="the host's CPython (MAJOR.MINOR) the wheelhouse is built for")
    platform: str = Field("manylinux_2_34_x86_64", description="the host's platform tag the wheelhouse is built "
                          "for (manylinux_2_34 = glibc >= 2.34)")
    runtime_wheel: Path | None = Field(None, description="prebuilt runtime wheel; default: build runtime/")
    runtime_source: Path | None = None


class WatchRules(_Strict):
    """Thresholds of the host-side watch for one profile (`opsctl.watch.rules.<profile>`,
    over `opsctl.watch.defaults`)."""

    accept_len_floor: float | None = Field(None, ge=1.0, description="default: the profile's accept_len_floor, "
                                           "else the gate's floor for its kind; never for autoregressive profiles")
    throughput_fraction: float | None = Field(0.3, gt=0, lt=1, description="breach when decode tok/s at the observed "
                                              "concurrency is below the baseline's bench curve x (1 - this); null: off")
    max_error_rate: float = Field(0.05, ge=0, le=1, description="aborted / (finished + aborted) requests in the window")
    min_requests: int = Field(10, ge=1, description="requests in the window before the error rate is judged")
    max_journal_errors: int = Field(4, ge=0, description="CUDA error / traceback lines allowed in the window")
    max_restarts: int = Field(1, ge=0, description="failed exits of the server allowed in the window")


class WatchNotify(_Strict):
    command: str | None = Field(None, description="run with /bin/sh -c; the JSON event on stdin, "
                                "OPSCTL_WATCH_EVENT=<kind> in the environment")
    url: str | None = Field(None, description="HTTP(S) URL that receives the JSON event as a POST")
    timeout_s: float = Field(5.0, gt=0, le=60)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", v):
            raise ValueError(f"{v!r} is not an http:// or https:// URL")
        return v


class WatchSettings(_Strict):
    """`opsctl.watch`: the host-side watch that keeps judging a promoted release
    (opsctl/watch/agent.py, its own systemd unit, installed by every deploy)."""

    enabled: bool = False
    mode: Literal["rollback", "alert"] = "rollback"
    interval_s: int = Field(15, ge=1, le=3600)
    window_s: int = Field(120, ge=2, le=86400)
    min_samples: int = Field(4, ge=1, description="decode samples a metric rule needs in the window")
    scrape_timeout_s: float = Field(5.0, gt=0, le=60)
    defaults: WatchRules = Field(default_factory=WatchRules)
    rules: dict[str, dict[str, Any]] = Field(default_factory=dict, description="per profile: WatchRules fields")
    notify: WatchNotify = Field(default_factory=WatchNotify)

    @model_validator(mode="after")
    def _window(self) -> "WatchSettings":
        if self.window_s < self.interval_s * self.min_samples:
            raise ValueError(f"window_s {self.window_s} cannot hold min_samples {self.min_samples} samples taken "
                             f"every interval_s {self.interval_s}s (needs window_s >= {self.interval_s * self.min_samples})")
        for name, data in self.rules.items():
            try:
                WatchRules(**{**self.defaults.model_dump(exclude_unset=True), **(data or {})})
            except ValidationError as exc:
                raise ValueError(f"rules.{name}: {_first_error(exc)}") from None
        return self

    def rules_for(self, profile: "Profile", gate_floor: float | None) -> WatchRules:
        rules = WatchRules(**{**self.defaults.model_dump(exclude_unset=True), **(self.rules.get(profile.name) or {})})
        if profile.kind == "autoregressive":
            return rules.model_copy(update={"accept_len_floor": None})
        if rules.accept_len_floor is None:
            floor = profile.accept_len_floor if profile.accept_len_floor is not None else gate_floor
            rules = rules.model_copy(update={"accept_len_floor": floor})
        return rules


class HostSettings(_Strict):
    """Everything under `opsctl:` for one host after merging all -> group -> host."""

    install_root: PurePosixPath = PurePosixPath("/opt/opsctl")
    service_name: str = "sglang-k26"
    service_user: str | None = None
    http_port: int = Field(30000, ge=1, le=65535)
    bind_address: str = "0.0.0.0"
    host_python: PurePosixPath = PurePosixPath("/usr/bin/python3")
    interconnect: Literal["pcie", "nvlink"]
    gpu: GPUFacts
    model: ModelFacts
    drafter: DrafterFacts
    runtime: RuntimeFacts
    baseline_profile: str = "ar-tp8"
    keep_releases: int = Field(5, ge=1)
    ssh_known_hosts: Path | None = None
    ssh_strict_host_keys: bool = True
    ssh_jump_host: str | None = Field(None, description="[user@]host[:port] SSH goes through (user: ansible_user, "
                                      "port: 22 by default); or ansible_ssh_common_args: \"-o ProxyJump=...\"")
    min_free_disk_gib: float = Field(20.0, ge=0)
    transfer_limit_mib_s: float | None = Field(None, gt=0, description="cap the drafter transfer rate (shared links)")
    guard_s: int | None = Field(None, ge=10, description="seconds after a switch before the host reverts an "
                                "unconfirmed release; default: readiness timeout + 30 min (gates included)")
    extra_env: dict[str, str] = Field(default_factory=dict)
    secrets_file: Path | None = Field(None, description="controller file of KEY=VALUE secrets (HF token, API key); shipped 0600")
    secrets_mode_ok: bool = Field(False, description="accept a secrets_file that group/others can read on the controller")
    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    gate: dict[str, Any] = Field(default_factory=dict)
    watch: WatchSettings = Field(default_factory=WatchSettings)

    @field_validator("service_name")
    @classmethod
    def _unit_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@-]*", v) or v.endswith(".service"):
            raise ValueError("service_name must be a bare unit name like 'sglang-k26' (no .service suffix)")
        return v


class HostConfig(_Strict):
    name: str
    groups: tuple[str, ...] = ()
    ssh: SSHSettings
    settings: HostSettings

    # shortcuts the rest of the code reads
    @property
    def install_root(self) -> PurePosixPath:
        return self.settings.install_root

    @property
    def service_name(self) -> str:
        return self.settings.service_name

    @property
    def unit_name(self) -> str:
        return f"{self.settings.service_name}.service"

    @property
    def http_port(self) -> int:
        return self.settings.http_port

    @property
    def host_python(self) -> PurePosixPath:
        return self.settings.host_python

    @property
    def gpu(self) -> GPUFacts:
        return self.settings.gpu

    @property
    def model(self) -> ModelFacts:
        return self.settings.model

    @property
    def drafter(self) -> DrafterFacts:
        return self.settings.drafter

    @property
    def runtime(self) -> RuntimeFacts:
        return self.settings.runtime

    @property
    def baseline_profile(self) -> str:
        return self.settings.baseline_profile

    def gate_policy(self):
        from opsctl.gates import GatePolicy  # gates owns the policy model

        try:
            return GatePolicy(**self.settings.gate)
        except ValidationError as exc:
            raise ConfigError(f"host {self.name}: opsctl.gate: {_first_error(exc)}",
                              "fix the gate policy in group_vars/ or host_vars/") from None

    def profile(self, name: str, budget: int | None = None) -> Profile:
        return resolve_profile(name, budget, overrides=self.settings.profiles)


class Inventory(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: Path
    name: str
    hosts: dict[str, HostConfig]
    groups: dict[str, tuple[str, ...]]

    def select(self, limit: str | None = None) -> list[HostConfig]:
        """Hosts in inventory order, narrowed by `--limit` (a host or a group name)."""
        if not limit:
            return list(self.hosts.values())
        names: list[str] = []
        for part in limit.split(","):
            part = part.strip()
            if part in self.hosts:
                names.append(part)
            elif part in self.groups:
                names.extend(self.groups[part])
            else:
                known = ", ".join(sorted([*self.hosts, *self.groups]))
                raise ConfigError(f"--limit {part!r} matches no host or group in {self.path}",
                                  f"use one of: {known}")
        seen: dict[str, HostConfig] = {}
        for n in names:
            seen.setdefault(n, self.hosts[n])
        return list(seen.values())

    def single(self, limit: str | None = None) -> HostConfig:
        hosts = self.select(limit)
        if len(hosts) != 1:
            raise ConfigError(f"{self.path} has {len(hosts)} hosts and this command acts on one",
                              "pick one with --limit HOST")
        return hosts[0]


# --------------------------------------------------------------------------- profile resolution


def profile_names(overrides: dict[str, dict[str, Any]] | None = None) -> list[str]:
    return sorted({*BUILTIN_PROFILES, *(overrides or {})})


def resolve_profile(name: str, budget: int | None = None, *,
                    overrides: dict[str, dict[str, Any]] | None = None) -> Profile:
    """Built-in profile `name`, with the inventory's overrides and the CLI budget applied."""
    overrides = overrides or {}
    if name not in BUILTIN_PROFILES and name not in overrides:
        import difflib

        known = profile_names(overrides)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        raise ConfigError(f"unknown profile {name!r}" + (f": did you mean {close[0]!r}?" if close else ""),
                          f"use one of: {', '.join(known)}")
    data: dict[str, Any] = {**BUILTIN_PROFILES.get(name, {}), **overrides.get(name, {}), "name": name}
    kind = data.get("kind")
    if budget is not None and kind != "ddtree":
        raise ConfigError(f"--budget applies only to ddtree profiles, not {name!r} ({kind})",
                          f"drop --budget, or deploy 'ddtree --budget {budget}'")
    if kind == "ddtree":
        if budget is None:
            budget = data.get("budget")
        if budget is None:
            raise ConfigError(f"profile {name!r} needs --budget N (DDTree's node budget)",
                              f"e.g. 'opsctl deploy {name} --budget 16'")
        if budget < 1 or budget > MAX_BUDGET:
            raise ConfigError(f"--budget {budget} is out of range: a DDTree budget is 1..{MAX_BUDGET} "
                              "nodes (verify width is budget + 1)", "use e.g. --budget 16")
        data["budget"] = budget
    try:
        return Profile(**data)
    except ValidationError as exc:
        raise ConfigError(f"profile {name!r}: {_first_error(exc)}",
                          "fix opsctl.profiles in the inventory's group_vars/host_vars") from None


# --------------------------------------------------------------------------- loading


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"missing required setting {loc}"
    return f"{loc}: {msg}" if loc else msg


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"malformed YAML at {where}: {problem}",
                          "fix the indentation/syntax on that line") from None


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}",
                          "see inventories/lab/ for the expected layout")
    return value


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _vars_file(directory: Path, name: str) -> dict:
    for candidate in (directory / f"{name}.yml", directory / f"{name}.yaml", directory / name / "main.yml"):
        if candidate.is_file():
            return _mapping(_read_yaml(candidate), str(candidate))
    return {}


def _walk_groups(name: str, node: dict, where: str, parents: tuple[str, ...],
                 groups: dict[str, list[str]], host_vars: dict[str, list[tuple[str, dict]]],
                 group_vars: dict[str, dict], order: list[str]) -> None:
    node = _mapping(node, where)
    unknown = set(node) - {"hosts", "children", "vars"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} in group {name!r}",
                          "a group has only 'hosts', 'children' and 'vars'")
    group_vars[name] = _deep_merge(group_vars.get(name, {}), _mapping(node.get("vars"), f"{where}.vars"))
    lineage = (*parents, name)
    for host, hvars in _mapping(node.get("hosts"), f"{where}.hosts").items():
        host = str(host)
        if host not in order:
            order.append(host)
        for g in lineage:
            if host not in groups.setdefault(g, []):
                groups[g].append(host)
        host_vars.setdefault(host, []).append(("inline", _mapping(hvars, f"{where}.hosts.{host}")))
    for child, cnode in _mapping(node.get("children"), f"{where}.children").items():
        _walk_groups(str(child), cnode, f"{where}.children.{child}", lineage, groups, host_vars, group_vars, order)


def load_inventory(path: str | Path) -> Inventory:
    """Load and validate an inventory directory (or a hosts.yml file inside one)."""
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
    groups: dict[str, list[str]] = {}
    host_vars: dict[str, list[tuple[str, dict]]] = {}
    group_vars: dict[str, dict] = {}
    order: list[str] = []
    _walk_groups("all", top["all"], f"{hosts_file.name}:all", (), groups, host_vars, group_vars, order)
    if not order:
        raise ConfigError(f"{hosts_file} defines no hosts", "add a host under all.children.<group>.hosts")

    gv_dir, hv_dir = directory / "group_vars", directory / "host_vars"
    hosts: dict[str, HostConfig] = {}
    for host in order:
        member_of = [g for g in groups if host in groups[g]]
        # precedence as in Ansible: all < other groups (sorted by depth then name) < host
        merged: dict = {}
        for g in ["all", *[g for g in member_of if g != "all"]]:
            merged = _deep_merge(merged, _vars_file(gv_dir, g))
            merged = _deep_merge(merged, group_vars.get(g, {}))
        for _, hv in host_vars[host]:
            merged = _deep_merge(merged, hv)
        merged = _deep_merge(merged, _vars_file(hv_dir, host))
        hosts[host] = _host_config(host, tuple(g for g in member_of if g != "all"), merged, directory)
    return Inventory(path=directory, name=directory.name, hosts=hosts,
                     groups={g: tuple(h) for g, h in groups.items()})


def _resolve_local(directory: Path, value: Any) -> Any:
    if value in (None, ""):
        return None
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else (directory / p).resolve()


def _host_config(name: str, groups: tuple[str, ...], merged: dict, directory: Path) -> HostConfig:
    settings = _mapping(merged.get("opsctl"), f"host {name}: opsctl")
    where = f"{directory}: host {name}"
    fix = f"set it in {directory}/group_vars/all.yml or {directory}/host_vars/{name}.yml"
    try:
        settings = dict(settings)
        for section, key in (("drafter", "source"), ("runtime", "wheelhouse"), ("runtime", "runtime_wheel"),
                             ("runtime", "runtime_source")):
            sec = settings.get(section)
            if isinstance(sec, dict) and key in sec:
                settings[section] = {**sec, key: _resolve_local(directory, sec[key])}
        for key in ("ssh_known_hosts", "secrets_file"):
            if key in settings:
                settings[key] = _resolve_local(directory, settings[key])
        parsed = HostSettings(**settings)
        ssh = SSHSettings.from_inventory(
            name, merged, key_file=_resolve_local(directory, merged.get("ansible_ssh_private_key_file")),
            known_hosts=parsed.ssh_known_hosts, strict_host_keys=parsed.ssh_strict_host_keys,
            jump_host=parsed.ssh_jump_host, where=where)
        host = HostConfig(name=name, groups=groups, ssh=ssh, settings=parsed)
    except ValidationError as exc:
        raise ConfigError(f"{where}: opsctl.{_first_error(exc)}", fix) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}", fix) from None
    # profile overrides are validated now, not at deploy time
    for pname in parsed.profiles:
        data = {**BUILTIN_PROFILES.get(pname, {}), **parsed.profiles[pname]}
        if data.get("kind") == "ddtree" and "budget" not in data:
            data["budget"] = 1  # budget comes from the CLI; validate the rest
        try:
            Profile(name=pname, **{k: v for k, v in data.items() if k != "name"})
        except ValidationError as exc:
            raise ConfigError(f"{where}: opsctl.profiles.{pname}: {_first_error(exc)}", fix) from None
    if parsed.baseline_profile not in profile_names(parsed.profiles):
        raise ConfigError(f"{where}: baseline_profile {parsed.baseline_profile!r} is not a known profile",
                          f"use one of: {', '.join(profile_names(parsed.profiles))}")
    unknown_rules = set(parsed.watch.rules) - set(profile_names(parsed.profiles))
    if unknown_rules:
        raise ConfigError(f"{where}: opsctl.watch.rules: unknown profile(s) {', '.join(sorted(unknown_rules))}",
                          f"use one of: {', '.join(profile_names(parsed.profiles))}")
    if resolve_profile(parsed.baseline_profile, overrides=parsed.profiles).kind != "autoregressive":
        raise ConfigError(f"{where}: baseline_profile {parsed.baseline_profile!r} is not autoregressive",
                          "the rollback baseline must be ar-tp8, ar-ep8 or another autoregressive profile")
    return host
