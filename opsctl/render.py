"""Pure rendering: (HostConfig, Profile) -> Rendered files and the server's argv.

No I/O besides reading templates/; the same inputs give the same bytes.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath

import jinja2

from opsctl.config import HostConfig, Profile
from opsctl import trialset
from opsctl.schedule import SCHEDULE_ENV, SCHEDULE_FILE

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
_SAFE_ARG = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


@dataclass(frozen=True)
class Rendered:
    """Everything a release installs, keyed by name inside the release directory."""

    host: str
    profile: Profile
    release_files: dict[str, str]
    argv: list[str]
    install_root: PurePosixPath
    unit_name: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def files(self) -> dict[str, str]:
        """Host path -> content, as the files are read once this release is live."""
        current = self.install_root / "current"
        return {str(current / name): text for name, text in sorted(self.release_files.items())}

    @property
    def unit_link(self) -> str:
        return f"/etc/systemd/system/{self.unit_name}"

    def digest(self) -> str:
        h = hashlib.sha256()
        for name, text in sorted(self.release_files.items()):
            h.update(name.encode() + b"\0" + text.encode() + b"\0")
        return h.hexdigest()

    def as_dict(self) -> dict:
        return {"host": self.host, "profile": self.profile.name, "budget": self.profile.budget,
                "budget_schedule": self.profile.budget_schedule, "trial_set": self.profile.trial_set,
                "schedule_bands": self.profile.schedule_bands,
                "verify_width": self.profile.verify_width, "argv": self.argv, "files": self.files,
                "links": {self.unit_link: str(self.install_root / "current" / self.unit_name)},
                "digest": self.digest()}


def _systemd_quote(arg: str) -> str:
    arg = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE_ARG.match(arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _env_quote(value: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]*", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=False, autoescape=False)
    env.filters["envquote"] = _env_quote
    return env


def env_python(host: HostConfig) -> PurePosixPath:
    return host.install_root / "shared" / "envs" / f"sglang-{host.runtime.sglang_version}" / "bin" / "python"


def server_argv(host: HostConfig, profile: Profile) -> list[str]:
    """The exact command line of the server; flags are SGLang 0.5.23's (checked in tests
    against ServerArgs.add_cli_args)."""
    current = host.install_root / "current"
    s = host.settings
    argv = [str(env_python(host)), "-m", "sglang.launch_server",
            "--model-path", str(s.model.path),
            "--served-model-name", s.model.name,
            "--trust-remote-code",
            "--host", s.bind_address,
            "--port", str(s.http_port),
            "--tp-size", str(profile.tp_size)]
    if profile.dp_size > 1:
        argv += ["--dp-size", str(profile.dp_size)]
    if profile.ep_size > 1:
        argv += ["--ep-size", str(profile.ep_size)]
    argv += ["--mem-fraction-static", f"{profile.mem_fraction_static:g}",
             "--attention-backend", profile.attention_backend,
             "--cuda-graph-max-bs-decode", str(max(profile.cuda_graph_bs) if profile.cuda_graph_bs
                                               else profile.cuda_graph_max_bs)]
    if profile.cuda_graph_bs:
        # the decode batch sizes captured, as chosen (SGLang 0.5.23: nargs="+"; its max_bs becomes the largest)
        argv += ["--cuda-graph-bs-decode", *(str(b) for b in profile.cuda_graph_bs)]
    if profile.max_running_requests:
        argv += ["--max-running-requests", str(profile.max_running_requests)]
    if profile.kind == "dflash":
        argv += ["--speculative-algorithm", "DFLASH",
                 "--speculative-draft-model-path", str(current / "drafter"),
                 "--speculative-num-draft-tokens", str(profile.verify_width)]
    elif profile.kind == "ddtree":
        # the runtime derives budget = num_draft_tokens - 1 and reads block_size from the drafter
        argv += ["--speculative-algorithm", "DDTREE",
                 "--speculative-draft-model-path", str(current / "drafter"),
                 "--speculative-num-draft-tokens", str(profile.verify_width)]
    argv += ["--enable-metrics", "--decode-log-interval", str(profile.decode_log_interval)]
    argv += list(profile.extra_args)
    return argv


def server_env(host: HostConfig, profile: Profile) -> dict[str, str]:
    root, current = host.install_root, host.install_root / "current"
    env = {
        "HOME": str(root / "shared" / "home"),
        # the JIT caches outside the release, kept across releases: SGLang puts FlashInfer's workspace,
        # Inductor, DeepGEMM, CUDA's and its autotune caches under SGLANG_CACHE_DIR; each keys its entries
        # by what built them (versions, arch, sources), so releases of any base env share it (docs/startup.md)
        "SGLANG_CACHE_DIR": str(root / "shared" / "cache" / "sglang"),
        "SGLANG_JIT_CACHE_DIR": str(root / "shared" / "cache" / "sglang-jit"),
        "TRITON_CACHE_DIR": str(root / "shared" / "cache" / "triton"),
        "PYTHONPATH": str(current / "site"),
        "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "OPSCTL_PROFILE": profile.label,
    }
    if profile.kind == "ddtree":
        env["SGLANG_PLUGINS"] = "ddtree"
        # the release's link to its runtime wheel's cache (opsctl/triton.py): filled before the switch
        env["TRITON_CACHE_DIR"] = str(current / "triton")
        if profile.schedule is not None:  # read by the runtime's plugin at server start
            env[SCHEDULE_ENV] = str(current / SCHEDULE_FILE)
        if profile.trial_set is not None:
            # every candidate captured at start; the control file (outside the release, so a live
            # switch changes no release file) names the one that serves, also after a restart
            env[trialset.TRIAL_SET_ENV] = str(current / trialset.TRIAL_SET_FILE)
            env[trialset.CONTROL_ENV] = str(trialset.control_path(root, profile.trial_set))
    env.update(host.settings.extra_env)
    env.update(profile.env)
    return dict(sorted(env.items()))


def render(host: HostConfig, profile: Profile) -> Rendered:
    # opsctl's own version is not in the rendered files: they name the release (its id is their
    # digest), and a controller upgraded to a new opsctl must not restart a host whose serving did
    # not change. The version goes in the release's manifest.json and ledger records (flow/plan.py).
    argv = server_argv(host, profile)
    env = server_env(host, profile)
    current = host.install_root / "current"
    context = {
        "profile": profile, "unit_name": host.unit_name,
        "service_name": host.service_name, "service_user": host.settings.service_user,
        "install_root": host.install_root, "current": current, "model": host.model,
        "sglang_version": host.runtime.sglang_version,
        "exec_start": " ".join(_systemd_quote(a) for a in argv), "env": env,
        "secrets": host.settings.secrets_file is not None, "restart_sec": host.settings.restart_sec,
        "timeout_stop_sec": host.settings.drain.timeout_stop_sec,
    }
    tpl = _environment()
    profile_doc = profile.model_dump(mode="json")
    if profile.schedule is None and profile.trial_set is None:
        # keep single-budget renders (and their release ids) as they were
        profile_doc.pop("budget_schedule")
        profile_doc.pop("tree_torch_fallback")
    if profile.trial_set is None:
        profile_doc.pop("trial_set")
    if profile.trial_bs is None:   # keep trial releases without levels (and their ids) as they were
        profile_doc.pop("trial_bs")
    if profile.cuda_graph_bs is None:   # keep renders without a chosen list (and their release ids) as they were
        profile_doc.pop("cuda_graph_bs")
    launch = {
        "profile": profile_doc, "verify_width": profile.verify_width,
        "argv": argv, "env": env, "service": host.unit_name, "model": host.model.model_dump(mode="json"),
        "sglang_version": host.runtime.sglang_version, "interconnect": host.settings.interconnect,
    }
    files = {
        host.unit_name: tpl.get_template("sglang.service.j2").render(context),
        "sglang.env": tpl.get_template("sglang.env.j2").render(context),
        "launch.json": json.dumps(launch, indent=2, sort_keys=True) + "\n",
    }
    if profile.schedule is not None:
        files[SCHEDULE_FILE] = profile.schedule.to_json()
    if profile.trial_set is not None:
        files[trialset.TRIAL_SET_FILE] = trialset.trial_set_json(profile.trial_set, trial_bs=profile.trial_bs)
    return Rendered(host=host.name, profile=profile, release_files=files, argv=argv,
                    install_root=host.install_root, unit_name=host.unit_name, env=env)
