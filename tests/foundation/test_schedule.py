"""DDTree budget schedules: parsing, the band a batch decodes in, what a release carries, and
the schedules refused at render time (one line, exit 2, nothing touched)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl import schedule
from opsctl.config import load_inventory, resolve_profile
from opsctl.errors import ConfigError
from opsctl.render import render

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "opsctl" / "lab" / "emulator"))
from sglang.lab.main import _capture_bs  # noqa: E402  (the emulator's copy of SGLang's rule)
from sglang.lab import schedule as emu_schedule  # noqa: E402


def test_parse_round_trips_and_reads_bands():
    s = schedule.parse(" 1:32, 8:16,32:8 ,64:0")
    assert s.text == "1:32,8:16,32:8,64:0"
    assert s.max_budget == 32 and s.widths == (33, 17, 9, 1)
    assert [s.band_range(i) for i in range(4)] == ["1-7", "8-31", "32-63", "64+"]
    assert json.loads(s.to_json()) == {"schedule": "1:32,8:16,32:8,64:0", "bands": [
        {"min_bs": 1, "budget": 32}, {"min_bs": 8, "budget": 16}, {"min_bs": 32, "budget": 8},
        {"min_bs": 64, "budget": 0}]}


@pytest.mark.parametrize("text,needle", [
    ("8:16,1:32", "must be sorted"),
    ("1:32,8:16,8:4", "two bands start at batch 8"),
    ("2:16,8:4", "a batch of 1 has no budget"),
    ("1:0,8:0", "every band has budget 0"),
    ("1:32,x", "is not MIN_BATCH:BUDGET"),
    ("1:2000", "above the runtime's 1024"),
    ("", "is empty"),
])
def test_bad_schedules_are_refused_with_the_reason(text, needle):
    with pytest.raises(ConfigError) as exc:
        schedule.parse(text)
    assert needle in exc.value.problem and "\n" not in exc.value.problem


def test_captured_batch_sizes_are_sglangs_speculative_list():
    assert schedule.captured_batch_sizes(32) == list(range(1, 9)) + list(range(10, 33, 2))
    assert schedule.captured_batch_sizes(64)[-7:] == [40, 44, 48, 52, 56, 60, 64]
    assert schedule.captured_batch_sizes(48) == [b for b in schedule.captured_batch_sizes(64) if b <= 48]
    assert schedule.captured_batch_sizes(64, max_running_requests=20) == list(range(1, 9)) + list(range(10, 21, 2))

    class Args:  # the emulator implements the same rule for its capture lines
        cuda_graph_bs_decode = None
        cuda_graph_max_bs_decode = 64
        max_running_requests = None
        disable_cuda_graph_padding = False
    assert schedule.captured_batch_sizes(64) == _capture_bs(Args, True)


def test_a_batch_takes_the_band_of_the_graph_it_replays_at():
    s = schedule.parse("1:16,8:4,32:0")
    cap = schedule.captured_batch_sizes(32)
    # 31 is not captured: it replays at the graph for 32, so it decodes in the 32+ band
    assert [s.band_for(b, cap).budget for b in (1, 7, 8, 9, 30, 31, 32, 40)] == [16, 16, 4, 4, 4, 0, 0, 0]
    assert s.band_range(1) == "8-31" and s.band_range(1, cap) == "8-30"
    # with coarser graphs a batch of 5 replays at bs 8, so it decodes in the 8+ band
    coarse = [1, 2, 4, 8, 16, 32]
    assert s.band_for(5, coarse).budget == 4 and s.band_for(4, coarse).budget == 16
    assert s.captured_by_band(cap) == [list(range(1, 8)), [8] + list(range(10, 31, 2)), [32]]
    # the emulator (the lab's model of the runtime) picks the same band for every batch size
    emu = emu_schedule.Schedule([(b.min_bs, b.budget) for b in s.bands], cap)
    assert all(emu.budget(b) == s.band_for(b, cap).budget for b in range(1, 80))


def test_profile_from_a_schedule_is_sized_for_its_widest_band():
    p = resolve_profile("ddtree", budget_schedule="1:16,8:4,32:0")
    assert p.budget == 16 and p.verify_width == 17
    assert p.label == "ddtree --budget-schedule 1:16,8:4,32:0" and p.slug == "ddtree-s1b16-8b4-32b0"
    assert resolve_profile("ddtree", 16).schedule is None


def test_a_release_carries_the_schedule_file_and_the_runtime_finds_it():
    host = load_inventory(REPO / "inventories/blackwell").hosts["blackwell"]
    r = render(host, host.profile("ddtree", budget_schedule="1:32,8:16,32:0"))
    assert json.loads(r.release_files[schedule.SCHEDULE_FILE])["schedule"] == "1:32,8:16,32:0"
    assert r.env[schedule.SCHEDULE_ENV] == f"{host.install_root}/current/{schedule.SCHEDULE_FILE}"
    assert r.argv[r.argv.index("--speculative-num-draft-tokens") + 1] == "33"
    single = render(host, host.profile("ddtree", 32))
    assert schedule.SCHEDULE_FILE not in single.release_files and schedule.SCHEDULE_ENV not in single.env
    assert '"budget_schedule"' not in single.release_files["launch.json"]  # single-budget renders unchanged


def test_render_json_shows_each_band_with_its_graphs(tmp_path):
    p = subprocess.run([sys.executable, "-m", "opsctl", "render", "ddtree", "--budget-schedule", "1:16,3:4,16:0",
                        "-i", "inventories/lab", "--json"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["budget_schedule"] == "1:16,3:4,16:0" and doc["verify_width"] == 17
    assert doc["schedule_bands"] == [
        "batch 1-2: budget 16 (verify width 17), graphs for bs [1, 2]",
        "batch 3-14: budget 4 (verify width 5), graphs for bs [3, 4, ..., 14] (9)",
        "batch 16+: no tree, drafter off (verify width 1), graphs for bs [16, 18, ..., 32] (9)"]


def test_schedule_checks_against_the_captured_graphs():
    with pytest.raises(ConfigError, match=r"band 9:4 \(batch 9\) holds no captured batch size .* replays at the "
                                          r"graph for 10"):
        resolve_profile("ddtree", budget_schedule="1:16,9:4,10:2")
    with pytest.raises(ConfigError, match="above the fused tree kernel's 64") as exc:
        resolve_profile("ddtree", budget_schedule="1:100,8:16")
    assert "tree_torch_fallback" in exc.value.fix
    ok = resolve_profile("ddtree", budget_schedule="1:100,8:16", overrides={"ddtree": {"tree_torch_fallback": True}})
    assert ok.budget == 100
    # the last band may start above the largest graph (those batches decode eagerly)
    assert resolve_profile("ddtree", budget_schedule="1:16,64:0").schedule.bands[-1].min_bs == 64
    with pytest.raises(ConfigError, match="--budget and --budget-schedule both given"):
        resolve_profile("ddtree", 16, budget_schedule="1:16")
    with pytest.raises(ConfigError, match="applies only to ddtree profiles"):
        resolve_profile("ar-tp8", budget_schedule="1:16")


def test_a_budget_whose_window_cannot_hold_the_drafter_block_is_refused():
    # the runtime (worker.check_shapes): block <= 2 x (budget + 1), the KV slots DFlash reserves per step
    assert resolve_profile("ddtree", 3).budget == 3
    with pytest.raises(ConfigError, match=r"--budget 2 is too small for the drafter's block of 8") as exc:
        resolve_profile("ddtree", 2)
    assert "at least 3" in exc.value.fix
    with pytest.raises(ConfigError, match="its largest budget 2 is too small"):
        resolve_profile("ddtree", budget_schedule="1:2,8:0")
    assert resolve_profile("ddtree", budget_schedule="1:16,8:1,32:0").budget == 16  # only the widest band counts


def test_inventory_profile_can_set_a_schedule_and_the_cli_budget_overrides_it():
    over = {"ddtree": {"budget_schedule": "1:16,8:4"}}
    assert resolve_profile("ddtree", overrides=over).budget_schedule == "1:16,8:4"
    assert resolve_profile("ddtree", 8, overrides=over).schedule is None  # --budget N is the one-band case


@pytest.mark.parametrize("args,needle", [
    (["--budget-schedule", "8:4,1:16"], "must be sorted"),
    (["--budget-schedule", "1:16,9:4,10:2"], "holds no captured batch size"),
    (["--budget-schedule", "1:16", "--budget", "16"], "--budget and --budget-schedule both given"),
])
def test_cli_refuses_bad_schedules_in_one_line_before_touching_anything(args, needle, tmp_path):
    p = subprocess.run([sys.executable, "-m", "opsctl", "deploy", "ddtree", *args, "-i", "inventories/lab", "--yes"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) <= 2 and needle in err[0] and "Traceback" not in p.stderr


def test_budget_has_every_limit_a_schedule_band_has_with_the_same_line():
    # --budget N is the one-band schedule 1:N: one check (schedule.check_budget) refuses both
    assert resolve_profile("ddtree", 64).budget == 64
    with pytest.raises(ConfigError) as one:
        resolve_profile("ddtree", 65)
    with pytest.raises(ConfigError) as band:
        resolve_profile("ddtree", budget_schedule="1:65,8:4")
    assert one.value.problem == "--budget 65: budget 65 is above the fused tree kernel's 64"
    assert band.value.problem.endswith(": budget 65 is above the fused tree kernel's 64")
    assert one.value.fix == band.value.fix and "tree_torch_fallback" in one.value.fix
    assert resolve_profile("ddtree", 100, overrides={"ddtree": {"tree_torch_fallback": True}}).budget == 100
    with pytest.raises(ConfigError, match=r"opsctl.profiles.ddtree.budget 80: budget 80 is above"):
        resolve_profile("ddtree", overrides={"ddtree": {"budget": 80}})


def test_deploy_budget_above_the_kernel_is_refused_before_any_host_io(tmp_path):
    inv = tmp_path / "inv"  # a host nothing answers for: any connection attempt would fail with exit 3
    shutil.copytree(REPO / "inventories/blackwell", inv)
    hosts = inv / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("blackwell.gpu.internal", "127.0.0.1").replace("ansible_port: 22",
                                                                                             "ansible_port: 1"))
    outs = {}
    for args in (["--budget", "100"], ["--budget-schedule", "1:100,8:4"]):
        p = subprocess.run([sys.executable, "-m", "opsctl", "deploy", "ddtree", *args, "-i", str(inv), "--yes"],
                           capture_output=True, text=True, cwd=REPO, timeout=60)
        assert p.returncode == 2, p.stdout + p.stderr
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and "Traceback" not in p.stderr, p.stderr
        assert "budget 100 is above the fused tree kernel's 64" in err[0]
        outs[args[0]] = err[0].split(": budget 100 ", 1)[1]
    assert outs["--budget"] == outs["--budget-schedule"]  # the same line after the flag that set it


@pytest.mark.parametrize("fallback,limit,by", [(False, 64, "the fused tree kernel's 64"),
                                               (True, 1024, "the runtime's 1024")])
def test_one_budget_limit_one_message_whatever_the_size(fallback, limit, by):
    # issue #49: --budget 100000 said "1..1024 nodes" and --budget 100 "above the fused tree kernel's 64"
    over = {"ddtree": {"tree_torch_fallback": True}} if fallback else None
    assert resolve_profile("ddtree", limit, overrides=over).budget == limit
    lines = {}
    for b in (limit + 1, 100, 100_000):
        if b <= limit:
            continue
        with pytest.raises(ConfigError) as exc:
            resolve_profile("ddtree", b, overrides=over)
        assert exc.value.problem == f"--budget {b}: budget {b} is above {by}"
        with pytest.raises(ConfigError) as band:
            resolve_profile("ddtree", budget_schedule=f"1:{b},8:4", overrides=over)
        assert band.value.problem == f"--budget-schedule 1:{b},8:4: budget {b} is above {by}"
        assert band.value.fix == exc.value.fix and f"1..{limit}" in exc.value.fix
        lines[b] = exc.value.fix
    assert len(set(lines.values())) == 1
    with pytest.raises(ConfigError) as zero:
        resolve_profile("ddtree", 0, overrides=over)
    assert zero.value.problem.startswith("--budget 0: budget 0 is below 1") and zero.value.fix == exc.value.fix


def test_tune_budgets_get_the_line_a_deploy_budget_gets():
    from opsctl import tune
    from opsctl.config import load_inventory

    inv = load_inventory(REPO / "inventories/lab")
    for b in (100, 100_000):
        with pytest.raises(ConfigError) as exc:
            tune.plan_tune(inv, tune.parse_budgets(f"8,{b}"))
        assert exc.value.problem == f"--budgets 8,{b}: budget {b} is above the fused tree kernel's 64"
        with pytest.raises(ConfigError) as dep:
            resolve_profile("ddtree", b)
        assert exc.value.fix == dep.value.fix
