"""Typed configuration: inventory (Ansible layout), host facts, deployment profiles.

The inventory directory is Ansible's own (`hosts.yml`, `group_vars/`, `host_vars/`),
so one set of files drives both ansible-runner and opsctl. opsctl's settings live
under one `opsctl:` mapping, deep-merged all -> groups -> host; SSH facts come from
the usual `ansible_*` variables.

Every key under `opsctl:` is a field of one of the models here (the gate policy is
opsctl.gate.decide.GatePolicy): an unknown key, a wrong type or an out-of-range value is a
ConfigError naming the file:line that set it, when the inventory loads.
"""
from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from opsctl import schedule as schedule_mod
from opsctl import trialset as trialset_mod
from opsctl.errors import ConfigError
from opsctl.gate.decide import GatePolicy  # gate/decide.py imports nothing from config (no cycle)
from opsctl.onhost.analysis import AnalysisSpec, build_spec
from opsctl.host.ssh import SSHSettings

ProfileKind = Literal["autoregressive", "dflash", "ddtree"]
MAX_BUDGET = 1024

# Values that reach a shell command on the host (paths, names, release ids built from profile
# names) are held to these patterns when the inventory loads, so no quoting mistake downstream
# can turn one into code (issue #32 item 10): no whitespace, quotes, $, `, ;, |, &, <, >, (, ), *, ?, ~
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
SAFE_PATH = re.compile(r"/(?:[A-Za-z0-9_.+@-]+/?)*")
SAFE_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*(?:/[A-Za-z0-9][A-Za-z0-9_.+-]*)*")
SAFE_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
SAFE_ADDRESS = re.compile(r"[A-Za-z0-9.:\[\]-]+")


def _safe(pattern: "re.Pattern[str]", value: Any, what: str, example: str) -> Any:
    text = str(value)
    if not pattern.fullmatch(text) or ".." in text.split("/"):
        raise ValueError(f"{text!r} is not a safe {what} (it reaches shell commands on the host): "
                         f"letters, digits and {example} only")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _NestedError(ValueError):
    """A model validator's error about one of the model's own settings: `loc` (relative
    to the model) lets the loader name the file:line of that setting."""

    def __init__(self, message: str, loc: tuple = ()):
        super().__init__(message)
        self.loc = tuple(loc)


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
    cuda_graph_bs: tuple[int, ...] | None = Field(None, description="the decode batch sizes captured, explicitly "
                                                  "(--cuda-graph-bs-decode; opsctl deploy --capture-from-traffic "
                                                  "chooses one): increasing, each at most cuda_graph_max_bs; None: "
                                                  "SGLang's own list up to cuda_graph_max_bs")
    max_running_requests: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1, description="concurrency the site serves; graphs must cover it")
    decode_log_interval: int = Field(40, ge=1)
    readiness_timeout_s: int = Field(1800, ge=5)
    accept_len_floor: float | None = Field(None, ge=1.0, description="this profile's accept-length floor in the "
                                           "bench gate and the watch (over the gate's floor for its kind)")
    budget_schedule: str | None = Field(None, description="DDTree budget by running batch size, "
                                        "'1:32,8:16,32:8,64:0' (opsctl/schedule.py); budget is its largest")
    tree_torch_fallback: bool = Field(False, description="allow schedule budgets above the fused tree kernel's "
                                      "64 (the runtime then builds those trees with the slower torch beam)")
    trial_set: tuple[str, ...] | None = Field(None, description="DDTree trial release (opsctl tune): every candidate "
                                              "budget and schedule captured at one start, switched live by a control "
                                              "file (opsctl/trialset.py); budget is their largest")
    trial_bs: tuple[int, ...] | None = Field(None, description="a trial set's tune levels: a candidate other than "
                                             "the active one captures only the batch sizes these reach (and each "
                                             "band's largest); the active one captures every size")
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        return _safe(SAFE_NAME, v, "profile name", "'_.+-' (e.g. ddtree-fast)")

    @model_validator(mode="after")
    def _kind_fields(self) -> "Profile":
        if self.kind in ("dflash", "ddtree") and self.block_size is None:
            raise ValueError(f"profile {self.name}: a {self.kind} profile needs block_size")
        if self.kind == "ddtree" and self.budget is None:
            raise ValueError(f"profile {self.name}: a ddtree profile needs a budget")
        if self.kind != "ddtree" and self.budget is not None:
            raise ValueError(f"profile {self.name}: budget only applies to ddtree profiles")
        if self.budget_schedule is not None:
            if self.kind != "ddtree":
                raise ValueError(f"profile {self.name}: budget_schedule only applies to ddtree profiles")
            sched = schedule_mod.parse(self.budget_schedule, what="budget_schedule")
            if self.budget != sched.max_budget:
                raise ValueError(f"profile {self.name}: budget {self.budget} is not the schedule's largest "
                                 f"({sched.max_budget}); the server is sized for the widest band")
        if self.trial_set is not None:
            if self.kind != "ddtree":
                raise ValueError(f"profile {self.name}: trial_set only applies to ddtree profiles")
            if self.budget_schedule is not None:
                raise ValueError(f"profile {self.name}: a trial set carries its schedules as candidates "
                                 "(the runtime refuses a schedule file beside it)")
            if not self.trial_set:
                raise ValueError(f"profile {self.name}: trial_set has no candidates")
            largest = trialset_mod.max_budget(self.trial_set)
            if self.budget != largest:
                raise ValueError(f"profile {self.name}: budget {self.budget} is not the trial set's largest "
                                 f"({largest}); the server is sized for the widest width")
        if self.trial_bs is not None:
            if self.trial_set is None:
                raise ValueError(f"profile {self.name}: trial_bs applies only to a trial set (opsctl tune)")
            if not self.trial_bs or min(self.trial_bs) < 1 or list(self.trial_bs) != sorted(set(self.trial_bs)):
                raise ValueError(f"profile {self.name}: trial_bs must be increasing batch sizes >= 1, "
                                 f"got {list(self.trial_bs)}")
        if self.cuda_graph_bs is not None:
            bs = list(self.cuda_graph_bs)
            if not bs or bs != sorted(set(bs)) or bs[0] < 1:
                raise ValueError(f"profile {self.name}: cuda_graph_bs {bs} is not an increasing list of batch sizes >= 1")
            if bs[-1] > self.cuda_graph_max_bs:
                raise ValueError(f"profile {self.name}: cuda_graph_bs reaches {bs[-1]}, past cuda_graph_max_bs "
                                 f"{self.cuda_graph_max_bs}")
        if self.kind == "autoregressive" and self.accept_len_floor is not None:
            raise ValueError(f"profile {self.name}: accept_len_floor only applies to speculative profiles "
                             "(an autoregressive server reports no accept length)")
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
    def schedule(self) -> "schedule_mod.BudgetSchedule | None":
        return schedule_mod.parse(self.budget_schedule) if self.budget_schedule else None

    @property
    def captured_batch_sizes(self) -> list[int]:
        return schedule_mod.captured_batch_sizes(self.cuda_graph_max_bs, self.max_running_requests,
                                                 explicit=self.cuda_graph_bs)

    @property
    def schedule_bands(self) -> list[str] | None:
        """One line per band of the budget schedule, with the graphs it captures (plan, render)."""
        sched = self.schedule
        return sched.describe(self.captured_batch_sizes) if sched else None

    @property
    def effective_max_concurrency(self) -> int:
        return self.max_concurrency or self.cuda_graph_max_bs

    @property
    def label(self) -> str:
        if self.trial_set:
            return f"{self.name} --trial-set {trialset_mod.describe(self.trial_set)}"
        if self.budget_schedule:
            return f"{self.name} --budget-schedule {self.budget_schedule}"
        return f"{self.name} --budget {self.budget}" if self.kind == "ddtree" else self.name

    @property
    def slug(self) -> str:
        if self.trial_set:  # 4,8,16 + 12 schedules -> t4-8-16-s12
            budgets = [c for c in self.trial_set if not trialset_mod.is_schedule(c)]
            scheds = len(self.trial_set) - len(budgets)
            return f"{self.name}-t" + "-".join(budgets or ["0"]) + (f"-s{scheds}" if scheds else "")
        if self.budget_schedule:  # 1:32,8:16 -> s1b32-8b16
            return f"{self.name}-s" + "-".join(p.replace(":", "b") for p in self.budget_schedule.split(","))
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

    @field_validator("path")
    @classmethod
    def _safe_path(cls, v: PurePosixPath) -> PurePosixPath:
        return _safe(SAFE_PATH, v, "absolute path", "'/_.+@-' (e.g. /srv/models/kimi-k2.6)")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        return _safe(SAFE_MODEL_NAME, v, "model name", "'_.+-' and '/' between parts (e.g. kimi-k2.6)")


class DrafterFacts(_Strict):
    source: Path = Field(description="drafter weights directory on the controller")
    reference_accept: dict[int, float] = Field(
        default_factory=dict, description="the drafter's accept length by DDTree budget as measured elsewhere "
        "(e.g. {8: 4.48, 16: 5.3}): what `opsctl diagnose` holds a release's acceptance to")

    @field_validator("reference_accept")
    @classmethod
    def _reference(cls, v: dict[int, float]) -> dict[int, float]:
        for budget, accept in v.items():
            if budget < 1 or accept < 1:
                raise ValueError(f"reference_accept {budget}: {accept}: a budget is >= 1 and an accept length "
                                 ">= 1 (it counts the bonus token)")
        return v


class RuntimeFacts(_Strict):
    sglang_version: str = "0.5.23"
    wheelhouse: Path = Field(description="controller directory of wheels for the base environment (offline install)")
    base_requirements: tuple[str, ...] = ("sglang==0.5.23",)
    python_version: str = Field("3.11", pattern=r"^3\.\d{1,2}$",
                                description="the host's CPython (MAJOR.MINOR) the wheelhouse is built for")
    platform: str = Field("manylinux_2_34_x86_64", description="the host's platform tag the wheelhouse is built "
                          "for (manylinux_2_34 = glibc >= 2.34)")
    wheelhouse_built_by: str | None = Field(None, description="the command that builds this wheelhouse when it is "
                                            "not 'opsctl wheelhouse build' (the lab's host runs the SGLang emulator: "
                                            "'opsctl lab up'); 'wheelhouse build' then refuses to resolve into it")
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
    (opsctl/onhost/watch_agent.py, its own systemd unit, installed by every deploy)."""

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
            raise _NestedError(f"window_s {self.window_s} cannot hold min_samples {self.min_samples} samples taken "
                               f"every interval_s {self.interval_s}s (needs window_s >= "
                               f"{self.interval_s * self.min_samples})", ("window_s",))
        for name, data in self.rules.items():
            try:
                WatchRules(**{**self.defaults.model_dump(exclude_unset=True), **(data or {})})
            except ValidationError as exc:
                raise _NestedError(f"rules.{name}: {_first_error(exc)}",
                                   ("rules", name, *exc.errors()[0]["loc"])) from None
        return self

    def rules_of(self, profile_name: str) -> WatchRules:
        """A profile's rules as configured (`rules.<profile>` over `defaults`); its floor, when
        not set here, is resolved with the gate's by the profile's analysis (HostConfig.analysis)."""
        return WatchRules(**{**self.defaults.model_dump(exclude_unset=True), **(self.rules.get(profile_name) or {})})


START_LIMIT_BURST = 3  # templates/sglang.service.j2: the starts systemd allows in StartLimitIntervalSec


def watch_window_problem(settings: "HostSettings") -> tuple[tuple, str, str] | None:
    """A watch window too short for its restarts rule (issue #32 item 6): (where in opsctl:, the
    problem, the fix), or None. A crash loop fails at most once per `restart_sec` (the unit's
    RestartSec) and the watch reads the journal once per `interval_s` (a failure counts when it
    is read, up to an interval late, and ticks drift), so the window must span `max_restarts`
    restart delays plus two intervals to hold the `max_restarts + 1` failures that breach
    whatever the phase of the ticks; and systemd stops the unit after StartLimitBurst starts, so a rule
    that needs more failures than that never trips. The metric rules' need (min_samples
    samples) is WatchSettings' own check."""
    w = settings.watch
    if not w.enabled:
        return None
    rules = [(("watch", "defaults", "max_restarts") if "max_restarts" in w.defaults.model_fields_set
              else ("watch", "window_s"), "opsctl.watch.defaults", w.defaults.max_restarts)]
    for name, data in sorted(w.rules.items()):
        if isinstance(data, dict) and "max_restarts" in data:
            rules.append((("watch", "rules", name, "max_restarts"), f"opsctl.watch.rules.{name}",
                          int(data["max_restarts"])))
    restart = settings.restart_sec
    for loc, where, n in rules:
        if n + 1 > START_LIMIT_BURST:
            return (loc, f"{where}.max_restarts {n}: the restarts rule needs {n + 1} failures of the server in one "
                         f"window, but systemd stops the unit after {START_LIMIT_BURST} starts (StartLimitBurst): a "
                         f"crash loop would never trip it",
                    f"set {where}.max_restarts to {START_LIMIT_BURST - 1} or less")
    loc, where, n = max(rules, key=lambda r: r[2])
    need = n * restart + 2 * w.interval_s
    if w.window_s < need:
        return (("watch", "window_s"),
                f"opsctl.watch.window_s {w.window_s} is shorter than the restarts rule needs: {where}.max_restarts "
                f"{n} trips at failure {n + 1}, which comes at least {n} x restart_sec {restart}s after the first, "
                f"each read up to an interval_s ({w.interval_s}s) late (needs window_s >= {need})",
                f"raise opsctl.watch.window_s to {need}"
                + (f", or lower opsctl.restart_sec to {lower}" if n and (lower := (w.window_s - 2 * w.interval_s) // n)
                   >= 1 else ""))
    return None


class DrainHook(_Strict):
    """One load-balancer hook (`opsctl.drain.hooks.out` / `.in`): a command run on the controller
    (`/bin/sh -c`, with OPSCTL_HOST, OPSCTL_ADDRESS, OPSCTL_PORT, OPSCTL_DRAIN=out|in in its env and
    the host's name and address as $1 and $2), or an HTTP call (the same fields as a JSON body)."""

    command: str | None = Field(None, description="run with /bin/sh -c on the controller; exit 0 = done")
    url: str | None = Field(None, description="HTTP(S) URL called with the host's name and address (JSON body)")
    method: Literal["POST", "PUT", "DELETE", "GET"] = "POST"
    timeout_s: float = Field(30.0, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("url must be an http:// or https:// URL")
        return v

    @model_validator(mode="after")
    def _one(self) -> "DrainHook":
        if (self.command is None) == (self.url is None):
            raise ValueError("a drain hook is either a command or a url (exactly one of them)")
        return self


class DrainHooks(_Strict):
    out: DrainHook | None = Field(None, description="takes the host out of the load balancer's pool before a switch")
    in_: DrainHook | None = Field(None, alias="in", description="puts it back once the server is ready (or the "
                                  "switch was called off)")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


DRAIN_DEADLINE_MAX_S = 600      # the derived deadline's cap (10 min)
DRAIN_DEADLINE_DEFAULT_S = 300  # without a stored bench to derive it from


class DrainSettings(_Strict):
    """`opsctl.drain`: drain the host before every switch (opsctl/drain.py, opsctl/flow/switch.py)."""

    enabled: bool = True
    hooks: DrainHooks = Field(default_factory=DrainHooks)
    deadline_s: float | None = Field(None, gt=0, le=3600, description="longest wait for in-flight requests; default: "
                                     "the stored baseline bench's p99 request time x 2, at most 600 s; "
                                     "300 s without one")
    poll_s: float = Field(1.0, gt=0, le=60, description="seconds between two reads of /v1/loads")

    @property
    def timeout_stop_sec(self) -> int:
        """The unit's TimeoutStopSec: above the longest drain (the deadline, else its 600 s cap),
        so systemd never cuts a drain short (SGLang 0.5.23 waits for in-flight requests on SIGTERM
        with no deadline of its own); 120 s with the drain off."""
        if not self.enabled:
            return 120
        return int(max(120, math.ceil(self.deadline_s or DRAIN_DEADLINE_MAX_S) + 60))


class TuneSettings(_Strict):
    """`opsctl.tune`: what `opsctl tune` leaves serving when it is not told to apply its result, and
    how long it waits for a live switch between the candidates of its trial release (opsctl/tune.py)."""

    restore: Literal["previous", "keep-trial"] = Field(
        "previous", description="previous: the release that served before the tune serves again (one restart); "
        "keep-trial: the trial release keeps serving, switched live to the recommendation (no restart; it stays "
        "unjudged, never the last good release); a tune with nothing to recommend restores either way")
    switch_timeout_s: float = Field(120.0, gt=0, le=3600, description="longest wait for the trial release to serve "
                                    "the next candidate after its control file names it (warm-up requests are "
                                    "sent meanwhile: the switch applies at a decode step)")


_SERIAL_PCT = re.compile(r"(\d+)%")


class RolloutPolicy(_Strict):
    """`opsctl.rollout`: how a deploy across several hosts proceeds (opsctl/flow/rollout.py).
    Set it once for the fleet (group_vars/all.yml); the selected hosts must agree."""

    canary: int | list[str] = Field(0, description="the first wave, on its own: a host count (the first N selected "
                                    "hosts) or host names")
    waves: list[int | str] = Field(default_factory=lambda: [1], description="the rest, in batches written as "
                                   "Ansible's serial: [1, \"25%\", \"100%\"] (the last size repeats)")
    max_fail_percentage: float = Field(0, ge=0, le=100, description="the rollout stops once more than this share "
                                       "of a wave failed its gates (Ansible's max_fail_percentage)")
    soak_s: int = Field(0, ge=0, le=86400, description="seconds between waves; then every host that took the "
                        "release must still be active and healthy")
    on_failure: Literal["rollback_all", "hold"] = Field("rollback_all", description="rollback_all: every host that "
                                                        "took the release goes back; hold: earlier waves keep it")
    max_unavailable: int = Field(1, ge=1, description="hosts out of the pool (draining, restarting) at once; a "
                                 "wave larger than this switches its hosts in groups of this size")

    @field_validator("canary")
    @classmethod
    def _canary(cls, v: int | list[str]) -> int | list[str]:
        if isinstance(v, int) and v < 0:
            raise ValueError("canary is a host count (>= 0) or a list of host names")
        return v

    @field_validator("waves")
    @classmethod
    def _waves(cls, v: list[int | str]) -> list[int | str]:
        if not v:
            raise ValueError("waves needs at least one batch size, e.g. [1, \"100%\"]")
        for item in v:
            if isinstance(item, int):
                if item < 1:
                    raise ValueError(f"wave size {item}: a batch holds at least 1 host")
            elif not (m := _SERIAL_PCT.fullmatch(item.strip())) or not 0 < float(m.group(1)) <= 100:
                raise ValueError(f"wave size {item!r}: write a host count (2) or a percentage of the hosts (\"25%\")")
        return v


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
    restart_sec: int = Field(30, ge=1, description="the unit's RestartSec: seconds systemd waits before starting a "
                             "crashed server again (long enough for its workers to free GPU memory and the port)")
    extra_env: dict[str, str] = Field(default_factory=dict)
    secrets_file: Path | None = Field(None, description="controller file of KEY=VALUE secrets (HF token, API key); shipped 0600")
    secrets_mode_ok: bool = Field(False, description="accept a secrets_file that group/others can read on the controller")
    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict, description="per profile: Profile fields")
    gate: GatePolicy = Field(default_factory=GatePolicy)
    watch: WatchSettings = Field(default_factory=WatchSettings)
    rollout: RolloutPolicy = Field(default_factory=RolloutPolicy)
    drain: DrainSettings = Field(default_factory=DrainSettings)
    tune: TuneSettings = Field(default_factory=TuneSettings)

    @field_validator("service_name")
    @classmethod
    def _unit_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@-]*", v) or v.endswith(".service"):
            raise ValueError("service_name must be a bare unit name like 'sglang-k26' (no .service suffix)")
        return v

    @field_validator("install_root", "host_python")
    @classmethod
    def _safe_path(cls, v: PurePosixPath) -> PurePosixPath:
        return _safe(SAFE_PATH, v, "absolute path", "'/_.+@-' (e.g. /opt/opsctl)")

    @field_validator("service_user")
    @classmethod
    def _safe_user(cls, v: str | None) -> str | None:
        return None if v is None else _safe(SAFE_USER, v, "user name", "'_.-' (e.g. sglang)")

    @field_validator("bind_address")
    @classmethod
    def _safe_address(cls, v: str) -> str:
        return _safe(SAFE_ADDRESS, v, "bind address", "'.:[]-' (e.g. 0.0.0.0 or ::)")

    @field_validator("baseline_profile")
    @classmethod
    def _safe_baseline(cls, v: str) -> str:
        return _safe(SAFE_NAME, v, "profile name", "'_.+-' (e.g. ar-tp8)")


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

    def gate_policy(self, profile: Profile | None = None) -> GatePolicy:
        """The host's gate policy (`opsctl.gate`, validated at load), a copy the caller
        may change. With a speculative `profile` whose `accept_len_floor` is set, that
        floor is the policy's accept-length floor for the profile's kind."""
        policy = self.settings.gate.model_copy(deep=True)
        if profile is not None and profile.speculative and profile.accept_len_floor is not None:
            policy = policy.model_copy(update={"accept_length_floor": {
                **policy.accept_length_floor, profile.kind: profile.accept_len_floor}})
        return policy

    def analysis(self, profile: Profile | None, policy: GatePolicy | None = None) -> AnalysisSpec:
        """The rules `profile`'s releases are held to on this host (opsctl/onhost/analysis.py): by
        the gate before promotion and by the watch after it, from `opsctl.gate` (or `policy`, the
        bench a caller planned from it) and `opsctl.watch`, in one place. None: a profile the
        inventory does not name (the watch's defaults)."""
        policy = policy or self.gate_policy(profile)
        fields = profile.model_dump(mode="json") if profile is not None else {"name": "", "kind": ""}
        return build_spec(fields, policy.model_dump(mode="json"),
                          self.settings.watch.rules_of(fields["name"]).model_dump(mode="json"), deploy=True)

    def profile(self, name: str, budget: int | None = None, budget_schedule: str | None = None, *,
                trial_set: list[str] | tuple[str, ...] | None = None,
                cuda_graph_bs: list[int] | tuple[int, ...] | None = None,
                trial_bs: list[int] | tuple[int, ...] | None = None) -> Profile:
        profile = resolve_profile(name, budget, overrides=self.settings.profiles, budget_schedule=budget_schedule,
                                  trial_set=trial_set, cuda_graph_bs=cuda_graph_bs, trial_bs=trial_bs)
        if profile.tp_size > self.gpu.count:  # hosts of a fleet differ (host_vars): refused before any host I/O
            raise ConfigError(f"profile {profile.label} runs tensor-parallel over {profile.tp_size} GPUs; host "
                              f"{self.name} has opsctl.gpu.count {self.gpu.count}",
                              f"deploy it with --limit to hosts that have {profile.tp_size} GPUs, or override "
                              f"opsctl.profiles.{profile.name}.tp_size in host_vars/{self.name}.yml")
        return profile


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
                    overrides: dict[str, dict[str, Any]] | None = None,
                    budget_schedule: str | None = None,
                    trial_set: list[str] | tuple[str, ...] | None = None,
                    cuda_graph_bs: list[int] | tuple[int, ...] | None = None,
                    trial_bs: list[int] | tuple[int, ...] | None = None) -> Profile:
    """Built-in profile `name`, with the inventory's overrides and the CLI budget (or
    budget schedule, or trial set: opsctl tune's candidates captured at one start) applied, and
    an explicit capture list (`cuda_graph_bs`: --capture-from-traffic's choice) over the profile's. A
    schedule is checked against the batch sizes the server will capture, so a band that could
    never run is refused here, before any host I/O."""
    overrides = overrides or {}
    cli_budget = budget
    if name not in BUILTIN_PROFILES and name not in overrides:
        import difflib

        known = profile_names(overrides)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        raise ConfigError(f"unknown profile {name!r}" + (f": did you mean {close[0]!r}?" if close else ""),
                          f"use one of: {', '.join(known)}")
    data: dict[str, Any] = {**BUILTIN_PROFILES.get(name, {}), **overrides.get(name, {}), "name": name}
    kind = data.get("kind")
    if budget is not None and budget_schedule is not None:
        raise ConfigError("--budget and --budget-schedule both given",
                          "use one: --budget N is the one-band schedule 1:N")
    if trial_set is not None and (budget is not None or budget_schedule is not None):
        raise ConfigError("--trial-set with --budget or --budget-schedule",
                          "use one: a trial set lists its budgets and schedules as candidates")
    for flag, value in (("--budget", budget), ("--budget-schedule", budget_schedule), ("--trial-set", trial_set)):
        if value is not None and kind != "ddtree":
            raise ConfigError(f"{flag} applies only to ddtree profiles, not {name!r} ({kind})",
                              f"drop {flag}, or deploy 'ddtree {flag} {value}'")
    if kind == "ddtree" and trial_set is not None:
        trial_set = tuple(trialset_mod.canonical(c) for c in trial_set)
        data["trial_set"] = trial_set
        if trial_bs is not None:
            data["trial_bs"] = tuple(sorted(set(int(b) for b in trial_bs)))
        data.pop("budget_schedule", None)
        budget = trialset_mod.max_budget(trial_set)
    elif kind == "ddtree":
        data.pop("trial_set", None)
        data.pop("trial_bs", None)
    if kind == "ddtree" and trial_set is None:
        sched_text = budget_schedule
        if sched_text is None and budget is None:
            sched_text = data.get("budget_schedule")
        if sched_text is not None:
            what = "--budget-schedule" if budget_schedule is not None else f"opsctl.profiles.{name}.budget_schedule"
            sched = schedule_mod.parse(str(sched_text), what=what,
                                       allow_torch_beam=bool(data.get("tree_torch_fallback")))
            data["budget_schedule"] = sched.text
            budget = sched.max_budget
        else:
            data.pop("budget_schedule", None)
        if budget is None:
            budget = data.get("budget")
        if budget is None:
            raise ConfigError(f"profile {name!r} needs --budget N or --budget-schedule (DDTree's node budget)",
                              f"e.g. 'opsctl deploy {name} --budget 16'")
    if kind == "ddtree":
        if data.get("trial_set") is None and not data.get("budget_schedule"):
            # --budget N (or the profile's budget): the one limit a schedule's band has too, checked
            # before the block-size rule so 100 and 100000 get the same line (issue #49)
            schedule_mod.check_budget(int(budget), allow_torch_beam=bool(data.get("tree_torch_fallback")),
                                      what=f"--budget {budget}" if cli_budget is not None
                                      else f"opsctl.profiles.{name}.budget {budget}")
        block = int(data.get("block_size") or 8)
        if block > 2 * (budget + 1):
            # the runtime's check (runtime worker.check_shapes): the drafter block and the verify window
            # share the 2 x (budget + 1) KV slots DFlash reserves per request and step
            what = (f"--budget-schedule {data['budget_schedule']}: its largest budget {budget}"
                    if data.get("budget_schedule") else f"--trial-set: its largest budget {budget}"
                    if data.get("trial_set") else f"--budget {budget}")
            raise ConfigError(f"{what} is too small for the drafter's block of {block}: the runtime reserves "
                              f"2 x (budget + 1) = {2 * (budget + 1)} KV slots per request and step and the "
                              f"block needs {block}", f"use a budget of at least {(block + 1) // 2 - 1}")
        data["budget"] = budget
    if cuda_graph_bs is not None:
        data["cuda_graph_bs"] = tuple(int(b) for b in cuda_graph_bs)
    try:
        prof = Profile(**data)
    except ValidationError as exc:
        raise ConfigError(f"profile {name!r}: {_first_error(exc)}",
                          "fix opsctl.profiles in the inventory's group_vars/host_vars") from None
    sched = prof.schedule
    if prof.trial_set is not None:  # every candidate as the runtime checks it at start
        trialset_mod.check_candidates(prof.trial_set, capture_bs=prof.captured_batch_sizes,
                                      allow_torch_beam=prof.tree_torch_fallback)
    elif sched is not None:
        schedule_mod.check_for_server(sched, capture_bs=prof.captured_batch_sizes,
                                      allow_torch_beam=prof.tree_torch_fallback,
                                      what="--budget-schedule" if budget_schedule is not None else "budget_schedule")
    elif prof.kind == "ddtree" and prof.budget is not None:  # --budget N: the one-band schedule 1:N, same limits
        schedule_mod.check_budget(prof.budget, allow_torch_beam=prof.tree_torch_fallback,
                                  what=f"--budget {prof.budget}" if cli_budget is not None
                                  else f"opsctl.profiles.{name}.budget {prof.budget}")
    return prof


# --------------------------------------------------------------------------- loading


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"missing required setting {loc}"
    return f"{loc}: {msg}" if loc else msg


class _Located(dict):
    """A YAML mapping that remembers where each of its keys was written (`file:line`),
    so an error about a setting can name the line that set it."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.where: dict[Any, str] = {}


class _LineLoader(yaml.SafeLoader):
    source = "<yaml>"


def _construct_located(loader: _LineLoader, node: yaml.MappingNode):
    data = _Located()
    yield data
    data.update(loader.construct_mapping(node))
    for key_node, _ in node.value:  # merge keys (<<) are flattened in by now; the last one wins, as in the dict
        data.where[loader.construct_object(key_node)] = f"{loader.source}:{key_node.start_mark.line + 1}"


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_located)


def _where(data: Any, loc: tuple) -> str | None:
    """`file:line` of the deepest key along `loc` that an inventory file wrote."""
    found, node = None, data
    for part in loc:
        if isinstance(node, dict) and part in node:
            found = getattr(node, "where", {}).get(part, found)
            node = node[part]
        elif isinstance(node, (list, tuple)) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            break
    return found


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None
    loader = _LineLoader(text)
    loader.source = str(path)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"malformed YAML at {where}: {problem}",
                          "fix the indentation/syntax on that line") from None
    finally:
        loader.dispose()


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}",
                          "see inventories/lab/ for the expected layout")
    return value


def _deep_merge(base: dict, extra: dict) -> dict:
    out = _Located(base)
    out.where = {**getattr(base, "where", {}), **getattr(extra, "where", {})}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


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


# --------------------------------------------------------------------------- every key acts or is refused

# settings that map names to one model's fields
_KEYED: dict[tuple[type[BaseModel], str], type[BaseModel]] = {
    (HostSettings, "profiles"): Profile,
    (WatchSettings, "rules"): WatchRules,
}
# keys inventories used to accept that never acted: refused with the reason
_REMOVED: dict[tuple[str, ...], str] = {
    ("drafter", "name"): "nothing ever read it (the served name is opsctl.model.name); delete the line",
}
_SSH_FIX = ("SSH facts are Ansible's variables beside opsctl:, not under it (ansible_host, ansible_user, "
            "ansible_port, ansible_ssh_private_key_file); under opsctl: only ssh_known_hosts and ssh_strict_host_keys")


def _submodel(model: type[BaseModel], key: Any) -> type[BaseModel] | None:
    field = next((f for n, f in model.model_fields.items() if (f.alias or n) == key), None) \
        if isinstance(key, str) else None
    ann = field.annotation if field is not None else None
    if ann is not None and not isinstance(ann, type):  # `Model | None`: the model
        args = [a for a in getattr(ann, "__args__", ()) if a is not type(None)]
        ann = args[0] if len(args) == 1 else None
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _settable(model: type[BaseModel]) -> list[str]:
    # a profile's name is its key under opsctl.profiles, never a setting; a field's YAML key is its alias
    return [f.alias or n for n, f in model.model_fields.items() if not (model is Profile and n == "name")]


def _check_keys(data: Any, model: type[BaseModel], path: tuple[str, ...], head: "_Head") -> None:
    """Every key of `data` (the settings for `model` at opsctl.<path>) is one of the
    model's fields, at every level; a mapping of the wrong type is left to the model."""
    if not isinstance(data, dict):
        return
    known = _settable(model)
    for key in data:
        if key not in known:
            raise _unknown_key(data, key, known, path, model, head)
    for key, value in data.items():
        sub = _submodel(model, key)
        if sub is not None:
            _check_keys(value, sub, (*path, key), head)
        elif (model, key) in _KEYED and isinstance(value, dict):
            for name, entry in value.items():
                _check_keys(entry, _KEYED[(model, key)], (*path, key, str(name)), head)


def _unknown_key(data: dict, key: Any, known: list[str], path: tuple[str, ...], model: type[BaseModel],
                 head: "_Head") -> ConfigError:
    import difflib

    dotted = ".".join(("opsctl", *path, str(key)))
    at = head.at(getattr(data, "where", {}).get(key))
    if (*path, str(key)) in _REMOVED:
        return ConfigError(f"{at}: {dotted} is not a setting (it never acted)", _REMOVED[(*path, str(key))])
    if model is Profile and key == "name":
        return ConfigError(f"{at}: {dotted}: a profile's name is its key under opsctl.profiles, not a setting",
                           "delete the name: line (rename the key to rename the profile)")
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    problem = f"{at}: unknown key {dotted}" + (f": did you mean {close[0]!r}?" if close else "")
    if close:
        fix = f"rename it to {close[0]!r}"
    elif not path and (str(key) == "ssh" or str(key).startswith("ansible_")):
        fix = _SSH_FIX
    else:
        fix = f"{'.'.join(('opsctl', *path))} takes only: {', '.join(known)}"
    return ConfigError(problem, fix)


class _Head:
    """How a host's errors begin: `file:line: host NAME` where the line is known,
    else `DIR: host NAME`."""

    def __init__(self, directory: Path, host: str, data: Any):
        self.directory, self.host, self.data = directory, host, data

    def at(self, where: str | None) -> str:
        return f"{where or self.directory}: host {self.host}"

    def of(self, *loc: Any) -> str:
        return self.at(_where(self.data, loc))

    def invalid(self, exc: ValidationError, prefix: tuple, fix: str) -> ConfigError:
        """A model's first error under opsctl.<prefix>, at the line that set it."""
        err = exc.errors()[0]
        inner = getattr((err.get("ctx") or {}).get("error"), "loc", ())  # a _NestedError's own setting
        loc = (*prefix, *err["loc"])
        at = self.of(*loc, *inner)
        dotted = ".".join(str(p) for p in loc)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            return ConfigError(f"{at}: opsctl: missing required setting {dotted}", fix)
        if _where(self.data, (*loc, *inner)) is not None:
            fix = "correct the value on that line"
        return ConfigError(f"{at}: opsctl.{dotted}: {msg}" if dotted else f"{at}: opsctl: {msg}", fix)


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
