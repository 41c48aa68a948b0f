"""Every inventory key acts or is refused (issue 14).

An unknown key anywhere under `opsctl:` is refused when the inventory loads, naming
the key and its file:line, with a did-you-mean where a known name is close; the gate
policy (`opsctl.gate`) is validated at load like the rest; a profile's
`accept_len_floor` is that profile's gate floor. Plain data: tmp inventories, no host.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.config import HostConfig, load_inventory
from opsctl.errors import ConfigError
from opsctl.gate.decide import GatePolicy

REPO = Path(__file__).resolve().parents[2]
OPSCTL = [sys.executable, "-m", "opsctl"]


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    dst = tmp_path / "inv"
    shutil.copytree(REPO / "inventories/lab", dst)
    return dst


def edit(path: Path, old: str, new: str) -> int:
    """Replace `old` (once) in `path`; the 1-based line where `new` starts."""
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))
    return text[:text.index(old)].count("\n") + 1


def add(path: Path, lines: str) -> int:
    """Append `lines` to `path`; the 1-based line of the first one."""
    text = path.read_text()
    path.write_text(text + lines)
    return text.count("\n") + 1


def load_error(inv: Path) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        load_inventory(inv)
    assert exc.value.exit_code == 2
    return exc.value


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# --------------------------------------------------------------------------- a typo at every level

TYPOS = [
    # (what it replaces, its typo, the dotted key in the message, did-you-mean or None)
    ("  min_free_disk_gib: 1", "  min_free_disk_gb: 1", "opsctl.min_free_disk_gb", "min_free_disk_gib"),
    ("  ssh_strict_host_keys: false", "  ssh_strict_host_key: false", "opsctl.ssh_strict_host_key",
     "ssh_strict_host_keys"),
    ("    count: 8", "    cuont: 8", "opsctl.gpu.cuont", "count"),
    ("    path: /srv/models/kimi-k2.6", "    paht: /srv/models/kimi-k2.6", "opsctl.model.paht", "path"),
    ("    source: /var/lib/opsctl-lab/drafter", "    sorce: /var/lib/opsctl-lab/drafter", "opsctl.drafter.sorce",
     "source"),
    ("    platform: manylinux_2_36_x86_64", "    platfrom: manylinux_2_36_x86_64", "opsctl.runtime.platfrom",
     "platform"),
    ("      max_concurrency: 32", "      max_concurency: 32", "opsctl.profiles.ddtree.max_concurency",
     "max_concurrency"),
    ("    ar-tp8: {readiness_timeout_s: 120}", "    ar-tp8: {readiness_timeout: 120}",
     "opsctl.profiles.ar-tp8.readiness_timeout", "readiness_timeout_s"),
    ("    requests_per_level: 8", "    requests_per_levle: 8", "opsctl.gate.requests_per_levle", "requests_per_level"),
    ("    canary_prompts: 4", "    canary_promts: 4", "opsctl.gate.canary_promts", "canary_prompts"),
    ("  keep_releases: 5", "  keep_releases: 5\n  watch:\n    intervl_s: 15", "opsctl.watch.intervl_s", "interval_s"),
    ("  keep_releases: 5", "  keep_releases: 5\n  watch:\n    defaults:\n      max_restrats: 2",
     "opsctl.watch.defaults.max_restrats", "max_restarts"),
    ("  keep_releases: 5", "  keep_releases: 5\n  watch:\n    rules:\n      ddtree:\n        accept_len_flor: 3",
     "opsctl.watch.rules.ddtree.accept_len_flor", "accept_len_floor"),
    ("  keep_releases: 5", "  keep_releases: 5\n  watch:\n    notify:\n      urll: http://x/y",
     "opsctl.watch.notify.urll", "url"),
    ("  keep_releases: 5", "  keep_releases: 5\n  frobnicate: true", "opsctl.frobnicate", None),
]


@pytest.mark.parametrize("old,new,key,close", TYPOS, ids=[t[2] for t in TYPOS])
def test_a_typo_at_every_level_is_refused_with_file_line_and_did_you_mean(inv, old, new, key, close):
    gv = inv / "group_vars/all.yml"
    edit(gv, old, new)
    line = line_of(gv.read_text(), key.rsplit(".", 1)[1] + ":")
    err = load_error(inv)
    msg = err.one_line()
    assert f"group_vars/all.yml:{line}: host lab: unknown key {key}" in msg, msg
    if close:
        assert f"did you mean {close!r}?" in msg and err.fix == f"rename it to {close!r}", msg
    else:
        assert "did you mean" not in msg and "takes only: install_root" in err.fix, msg


def test_a_typo_in_a_host_vars_file_names_that_file(inv):
    (inv / "host_vars").mkdir()
    hv = inv / "host_vars/lab.yml"
    # the host's complete opsctl: mapping (Ansible replaces a mapping set at two levels), with a typo
    hv.write_text("# per host\n" + (inv / "group_vars/all.yml").read_text())
    line = edit(hv, "    warmup: 2\n", "    warmup: 2\n    warmups: 1\n") + 1
    msg = load_error(inv).one_line()
    assert f"{hv}:{line}: host lab: unknown key opsctl.gate.warmups: did you mean 'warmup'?" in msg, msg


def test_a_typo_inline_in_hosts_yml_names_hosts_yml(inv):
    hosts = inv / "hosts.yml"
    line = edit(hosts, "          ansible_port: 22\n",
                "          ansible_port: 22\n          opsctl:\n            http_prot: 30001\n") + 2
    msg = load_error(inv).one_line()
    assert f"{hosts}:{line}: host lab: unknown key opsctl.http_prot: did you mean 'http_port'?" in msg, msg


def test_ansible_ssh_facts_under_opsctl_are_refused_with_where_they_belong(inv):
    line = edit(inv / "group_vars/all.yml", "  keep_releases: 5\n", "  keep_releases: 5\n  ansible_port: 2222\n") + 1
    err = load_error(inv)
    assert f"all.yml:{line}: host lab: unknown key opsctl.ansible_port" in err.problem
    assert "beside opsctl:" in err.fix and "ssh_known_hosts" in err.fix


def test_a_group_with_an_unknown_key_names_its_line(inv):
    hosts = inv / "hosts.yml"
    line = edit(hosts, "    gpu_hosts:\n", "    gpu_hosts:\n      varz: {}\n") + 1
    msg = load_error(inv).one_line()
    assert f"hosts.yml:{line}: " in msg and "unknown key(s) ['varz']" in msg, msg


# --------------------------------------------------------------------------- profiles

def test_a_typo_in_a_profile_name_is_refused_with_did_you_mean(inv):
    gv = inv / "group_vars/all.yml"
    line = edit(gv, "    dflash: {readiness_timeout_s: 120}", "    dflsah: {readiness_timeout_s: 120}")
    err = load_error(inv)
    assert f"all.yml:{line}: host lab: opsctl.profiles.dflsah: not a built-in profile: did you mean 'dflash'?" \
        in err.problem, err.problem


def test_a_profile_override_cannot_set_its_name(inv):
    gv = inv / "group_vars/all.yml"
    line = edit(gv, "    dflash: {readiness_timeout_s: 120}", "    dflash: {readiness_timeout_s: 120, name: fast}")
    err = load_error(inv)
    assert f"all.yml:{line}: host lab: opsctl.profiles.dflash.name" in err.problem, err.problem


def test_accept_len_floor_on_an_autoregressive_profile_is_refused(inv):
    gv = inv / "group_vars/all.yml"
    line = edit(gv, "    ar-ep8: {readiness_timeout_s: 120}", "    ar-ep8: {readiness_timeout_s: 120, accept_len_floor: 2}")
    err = load_error(inv)
    assert f"all.yml:{line}: host lab: opsctl.profiles.ar-ep8" in err.problem
    assert "only applies to speculative profiles" in err.problem


def test_a_profile_value_out_of_range_names_its_line(inv):
    gv = inv / "group_vars/all.yml"
    line = edit(gv, "    dflash: {readiness_timeout_s: 120}", "    dflash: {readiness_timeout_s: 2}")
    err = load_error(inv)
    assert f"all.yml:{line}: host lab: opsctl.profiles.dflash.readiness_timeout_s: Input should be greater" \
        in err.problem, err.problem


# --------------------------------------------------------------------------- dead keys

def test_drafter_name_never_acted_and_is_refused(inv):
    gv = inv / "group_vars/all.yml"
    line = edit(gv, "    source: /var/lib/opsctl-lab/drafter\n",
                "    source: /var/lib/opsctl-lab/drafter\n    name: kimi-k2.6-dflash\n") + 1
    err = load_error(inv)
    assert f"all.yml:{line}: host lab: opsctl.drafter.name is not a setting" in err.problem, err.problem
    assert "delete the line" in err.fix


def test_the_shipped_inventories_load():
    for name in ("lab", "blackwell"):
        inventory = load_inventory(REPO / "inventories" / name)
        assert inventory.hosts


# --------------------------------------------------------------------------- the gate policy at load time

@pytest.mark.parametrize("old,new,key,needle", [
    ("    requests_per_level: 8", "    requests_per_level: many", "requests_per_level", "valid integer"),
    ("    requests_per_level: 8", "    requests_per_level: 0", "requests_per_level", "greater than or equal to 1"),
    ("    repeats: 2", "    repeats: 50", "repeats", "less than or equal to 20"),
    ("    concurrency: [1, 4, 8]", "    concurrency: [1, 0, 8]", "concurrency.1", "greater than or equal to 1"),
    ("    concurrency: [1, 4, 8]", "    concurrency: []", "concurrency", "at least 1 item"),
    ("    concurrency: [1, 4, 8]", "    concurrency: [1, 4, 8]\n    confidence: 1.5", "confidence", "less than 1"),
    ("    concurrency: [1, 4, 8]", "    concurrency: [1, 4, 8]\n    require_canary: perhaps", "require_canary",
     "valid boolean"),
])
def test_the_gate_policy_is_validated_when_the_inventory_loads(inv, old, new, key, needle):
    gv = inv / "group_vars/all.yml"
    edit(gv, old, new)
    line = line_of(gv.read_text(), new.splitlines()[-1].strip())
    err = load_error(inv)
    assert f"all.yml:{line}: host lab: opsctl.gate.{key}: " in err.problem and needle in err.problem, err.problem


def test_an_unknown_workload_in_the_gate_mix_names_its_line(inv):
    gv = inv / "group_vars/all.yml"
    line = edit(gv, "workloads: {humaneval: 0.3,", "workloads: {humaneva: 0.3,")
    err = load_error(inv)
    assert f"all.yml:{line}: host lab: opsctl.gate.workloads: unknown workload 'humaneva': did you mean " \
           "'humaneval'?" in err.problem, err.problem


def test_settings_hold_one_gate_policy_model(inv):
    host = load_inventory(inv).hosts["lab"]
    assert isinstance(host.settings.gate, GatePolicy) and host.settings.gate.requests_per_level == 8
    policy = host.gate_policy()
    policy.concurrency.append(99)              # a copy: the caller may change it
    assert host.gate_policy().concurrency == [1, 4, 8]


def test_the_gate_decision_does_not_import_config():
    code = "import sys, opsctl.gate.decide; assert 'opsctl.config' not in sys.modules; import opsctl.config"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


# --------------------------------------------------------------------------- a profile's floor reaches the gate

def test_a_profiles_accept_len_floor_is_its_gate_floor(inv):
    gv = inv / "group_vars/all.yml"
    edit(gv, "      readiness_timeout_s: 120\n    ar-tp8", "      readiness_timeout_s: 120\n"
         "      accept_len_floor: 3.25\n    ar-tp8")
    host = load_inventory(inv).hosts["lab"]
    ddtree = host.profile("ddtree", 16)
    assert host.gate_policy().analysis("ddtree").accept_length.floor == 2.0   # the gate's floor for the kind
    assert host.analysis(ddtree).accept_length.floor == 3.25                  # the profile's own
    assert host.analysis(host.profile("dflash")).accept_length.floor == 2.0   # other kinds keep theirs
    assert host.analysis(host.profile("ar-tp8")).accept_length.floor is None
    assert host.gate_policy(ddtree).accept_length_floor["ddtree"] == 3.25     # as the verdict records the policy


def test_the_profile_floor_fails_a_release_the_kind_floor_would_pass(inv):
    from opsctl.gate.results import BenchLevel, BenchRun
    from opsctl.gate.decide import judge

    edit(inv / "group_vars/all.yml", "      readiness_timeout_s: 120\n    ar-tp8",
         "      readiness_timeout_s: 120\n      accept_len_floor: 3.0\n    ar-tp8")
    host = load_inventory(inv).hosts["lab"]

    def run(tok_s: float, accept: float | None) -> BenchRun:
        return BenchRun(levels=[BenchLevel(max_concurrency=c, repeat=rep, output_throughput=tok_s * c,
                                           median_itl_ms=10.0, completed=8, level_accept_length=accept)
                                for c in (1, 4, 8) for rep in range(3)])

    base, cand = run(100.0, None), run(120.0, 2.5)
    kind_floor = judge(cand, base, host.gate_policy(), profile_kind="ddtree", canary_ran=True)
    own_floor = judge(cand, base, host.gate_policy(host.profile("ddtree", 16)), profile_kind="ddtree",
                      canary_ran=True)
    assert kind_floor.status == "pass", kind_floor.reasons
    assert own_floor.status == "fail" and any("floor 3.00" in r for r in own_floor.reasons), own_floor.reasons


def test_bench_and_judge_asks_for_the_profiles_policy(inv, monkeypatch):
    from opsctl.flow import judge

    host = load_inventory(inv).hosts["lab"]
    profile = host.profile("ddtree", 16)
    seen = []

    class Stop(Exception):
        pass

    def fake(self, profile=None):
        seen.append(profile)
        raise Stop

    monkeypatch.setattr(HostConfig, "gate_policy", fake)
    with pytest.raises(Stop):
        judge.bench_and_judge(None, host, profile, "r1", None)
    assert seen == [profile]


# --------------------------------------------------------------------------- through the CLI, as a user would

def opsctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*OPSCTL, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


@pytest.mark.parametrize("old,new,needle", [
    ("    requests_per_level: 8", "    requests_per_levle: 8",
     "unknown key opsctl.gate.requests_per_levle: did you mean 'requests_per_level'?"),
    ("    requests_per_level: 8", "    requests_per_level: -1", "opsctl.gate.requests_per_level: Input should be"),
    ("    requests_per_level: 8", "    requests_per_level: [8]", "opsctl.gate.requests_per_level: Input should be"),
    ("      max_concurrency: 32", "      max_concurency: 32", "unknown key opsctl.profiles.ddtree.max_concurency"),
])
def test_render_refuses_a_bad_inventory_in_one_line_with_file_line(inv, old, new, needle):
    gv = inv / "group_vars/all.yml"
    line = edit(gv, old, new)
    proc = opsctl("render", "ar-tp8", "-i", str(inv))
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: {gv}:{line}: host lab: ") and needle in lines[0], lines[0]
    assert "(fix: " in lines[0] and proc.stdout == ""
