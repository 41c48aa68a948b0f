"""Unit tests for the pure parts of the host checks (no host, no lab)."""
from __future__ import annotations

import pytest

from opsctl.checks import catalog, logic
from opsctl.host import facts

GPU_CSV = "\n".join(
    f"{i}, GPU-{i:04d}, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887, {4 + (1000 if i < 2 else 0)}, 580.95.05"
    for i in range(8))


@pytest.mark.parametrize("version,lo,hi,ok", [
    ("580.95.05", "580.0", "599.99", True),
    ("580.0", "580.0", "599.99", True),          # bounds are inclusive
    ("579.99.01", "580.0", "599.99", False),
    ("599.99.01", "580.0", "599.99", True),      # compared at the bound's precision
    ("600.0", "580.0", "599.99", False),
    ("570.86.10", None, None, True),
    ("570.86.10", "575", None, False),
    ("610.1", None, "600", False),
])
def test_driver_in_range(version, lo, hi, ok):
    assert logic.driver_in_range(version, lo, hi) is ok


def test_parse_version_rejects_garbage():
    with pytest.raises(ValueError):
        logic.parse_version("N/A")
    assert logic.parse_version("580.95.05") == (580, 95, 5)


def test_parse_gpus_and_apps():
    gpus = facts.Gpus().process(GPU_CSV)
    assert len(gpus) == 8 and gpus[0].name == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    assert gpus[1].used_mib == 1004 and gpus[7].total_mib == 97887 and gpus[3].driver == "580.95.05"
    apps = facts.GpuProcesses().process("123, GPU-0000, 1000 MiB\n123, GPU-0001, 1000\n456, GPU-0001, [N/A]\n")
    assert [(a.pid, a.gpu_uuid, a.used_mib) for a in apps] == [(123, "GPU-0000", 1000), (123, "GPU-0001", 1000),
                                                               (456, "GPU-0001", 0)]
    assert facts.GpuProcesses().process("") == []


def test_effective_free_counts_out_our_service():
    gpus = facts.Gpus().process(GPU_CSV)
    apps = facts.GpuProcesses().process("123, GPU-0000, 1000\n123, GPU-0001, 1000\n")
    free = logic.effective_free_mib(gpus, apps, own={123})
    assert free[0] == (97887 - 4, 1000) and free[5] == (97883, 0)
    free = logic.effective_free_mib(gpus, apps, own=set())
    assert free[0] == (97887 - 1004, 0)


def test_owned_pids_by_cgroup():
    text = ("== 10\n0::/system.slice/sglang-k26.service\n"
            "== 11\n1:name=systemd:/system.slice/sglang-k26.service/worker\n0::/system.slice/sglang-k26.service\n"
            "== 12\n0::/system.slice/opsctl-lab-gpu-leftover.service\n"
            "== 13\n0::/system.slice/sglang-k26.service.bak\n"
            "== 14\n")
    assert logic.owned_pids(text, "sglang-k26.service") == {10, 11}


def test_ss_and_df_parsing():
    ss = 'LISTEN 0 8 0.0.0.0:30000 0.0.0.0:* users:(("python3",pid=4321,fd=3),("python3",pid=4322,fd=3))'
    assert logic.ss_pids(ss) == {4321, 4322}
    df = ("Filesystem     1024-blocks  Used Available Capacity Mounted on\n"
          "tmpfs                 1024     0      1024       0% /opt/opsctl\n")
    assert logic.df_avail_bytes(df) == (1024 * 1024, "/opt/opsctl")


def test_unit_drift_names_the_lines():
    expected = "[Service]\nType=simple\nRestartSec=30\nTimeoutStopSec=120\nKillMode=control-group\n"
    assert logic.unit_drift(expected, expected) == []
    edited = "[Service]\nType=simple\nRestartSec=5\nTimeoutStopSec=120\nKillMode=control-group\nNice=-5\n"
    assert logic.unit_drift(expected, edited) == [
        "line 3: expected 'RestartSec=30', found 'RestartSec=5'",
        "line 6: unexpected 'Nice=-5'",
    ]
    removed = "[Service]\nType=simple\nRestartSec=30\nKillMode=control-group\n"
    assert logic.unit_drift(expected, removed) == ["line 4: missing 'TimeoutStopSec=120'"]
    assert logic.unit_drift(expected, expected.rstrip("\n")) == ["trailing newline differs"]


def test_last_switch_record():
    ledger = [
        {"action": "deploy", "result": "started", "to_release": "a"},
        {"action": "promote", "result": "ok", "to_release": "a"},
        {"action": "verdict", "status": "pass", "release": "a"},
        {"action": "deploy", "result": "started", "to_release": "b"},
        {"action": "rollback", "result": "ok", "to_release": "a", "automatic": True},
        {"action": "bench", "release": "a"},
    ]
    assert logic.last_switch_record(ledger)["action"] == "rollback"
    assert logic.last_switch_record([{"action": "verdict"}]) is None
    stopped = ledger + [{"action": "rollback", "result": "ok", "to_release": None}]
    assert logic.last_switch_record(stopped)["to_release"] is None


def test_summarize_and_one_line():
    assert logic.summarize(["a", "b", "c", "d", "e"]) == "a; b; c; and 2 more"
    assert logic.one_line("x\n  y") == "x y"
    assert len(logic.one_line("z" * 500)) == 300


def test_catalog_covers_every_check_function():
    import opsctl.checks.test_post as post
    import opsctl.checks.test_pre as pre

    for mod, group in ((pre, "pre"), (post, "post")):
        funcs = [n.removeprefix("test_") for n in dir(mod) if n.startswith("test_")]
        assert sorted(funcs) == sorted(catalog.names(group)), group
    assert "ssh" in catalog.fix_for("ssh_reachable").lower()
    assert "sglang-k26.service" in catalog.fix_for("unit_active", unit="sglang-k26.service")
