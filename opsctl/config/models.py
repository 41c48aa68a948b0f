"""The typed settings: every key under an inventory's `opsctl:` is a field of one of these models
(the gate policy is opsctl.gate.decide.GatePolicy), so an unknown key, a wrong type or an
out-of-range value is refused when the inventory loads. Profile (a deployment profile), the host
facts (GPUs, model, drafter, runtime), the watch, drain, tune and rollout settings, HostSettings
(one host's `opsctl:`), HostConfig (a host: its name, groups, SSH settings and settings) and
Inventory. Pure: no files are read here (loader.py reads the inventory)."""
from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

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


METRICS_TEXTFILE_DEFAULT = PurePosixPath("/var/lib/prometheus/node-exporter/opsctl.prom")


class MetricsSettings(_Strict):
    """`opsctl.metrics`: opsctl's node_exporter textfile on the host (docs/metrics.md), kept
    current by the host itself (every ledger record, every watch tick)."""

    textfile: PurePosixPath | None = Field(METRICS_TEXTFILE_DEFAULT, description="the file node_exporter's textfile "
                                           "collector reads (its --collector.textfile.directory, a name ending in "
                                           ".prom); null: no metrics file")

    @field_validator("textfile")
    @classmethod
    def _prom_file(cls, v: PurePosixPath | None) -> PurePosixPath | None:
        if v is None:
            return v
        _safe(SAFE_PATH, v, "absolute path", "'/_.+@-' (e.g. /var/lib/prometheus/node-exporter/opsctl.prom)")
        if v.suffix != ".prom" or v.name.startswith("."):
            raise ValueError(f"{str(v)!r}: node_exporter's textfile collector reads only files named *.prom "
                             f"(e.g. {METRICS_TEXTFILE_DEFAULT})")
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
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)

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
        w = self.settings.watch
        watch = {**w.rules_of(fields["name"]).model_dump(mode="json"), "window_s": w.window_s,
                 "min_samples": w.min_samples}
        return build_spec(fields, policy.model_dump(mode="json"), watch, deploy=True)

    def profile(self, name: str, budget: int | None = None, budget_schedule: str | None = None, *,
                trial_set: list[str] | tuple[str, ...] | None = None,
                cuda_graph_bs: list[int] | tuple[int, ...] | None = None,
                trial_bs: list[int] | tuple[int, ...] | None = None) -> Profile:
        from opsctl.config.profiles import resolve_profile

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



def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"missing required setting {loc}"
    return f"{loc}: {msg}" if loc else msg


def inventory_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of an inventory variables file's `opsctl:` mapping, from
    HostSettings (every key typed, an unknown one refused, as the loader refuses it): for editors'
    YAML language servers (`opsctl config schema`, docs/inventory.md). A host's mapping is merged
    from several files (all -> group -> host), so no key is required in any one file; the loader
    checks the merged mapping."""
    settings = HostSettings.model_json_schema()
    settings.pop("required", None)
    defs = settings.pop("$defs", {})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://opsctl.invalid/schema/inventory-vars.json",
        "title": "opsctl inventory variables (group_vars/*.yml, host_vars/*.yml)",
        "description": "The `opsctl:` mapping of an Ansible inventory's variables file; every other key is "
                       "Ansible's and not checked here. Generated by `opsctl config schema` from opsctl's models.",
        "type": "object",
        "properties": {"opsctl": {**settings, "title": "opsctl"}},
        "additionalProperties": True,
        "$defs": defs,
    }
