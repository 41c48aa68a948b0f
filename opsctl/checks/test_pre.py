"""Pre-deploy host checks: can this host take a release?

Each test is one check, run once per inventory host (testinfra's `host` fixture,
parametrized from the inventory by opsctl.checks.plugin); each passes or fails on
its own. Our own running service is not a problem: its GPU processes, GPU memory and
port are the ones a deploy replaces.
"""
from __future__ import annotations

import shlex
import time

import pytest

from opsctl.checks import logic

GIB = 1 << 30
MAX_CLOCK_SKEW_S = 2.0


def test_ssh_reachable(host, hostcfg, probe, detail):
    err = probe.unreachable()
    assert err is None, f"cannot run commands on {hostcfg.name} over SSH: {err}"
    user, node = (probe.whoami() + ["?", "?"])[:2]
    s = hostcfg.ssh
    detail(f"{s.user}@{s.address}:{s.port} -> {user} on {node}")


def test_gpu_count(hostcfg, probe, detail):
    gpus = probe.gpus()
    want = hostcfg.gpu.count
    assert len(gpus) == want, f"nvidia-smi lists {len(gpus)} GPU(s), the inventory expects {want}"
    detail(f"{len(gpus)} GPUs")


def test_gpu_model(hostcfg, probe, detail):
    gpus = probe.gpus()
    want = hostcfg.gpu.model.strip()
    wrong = [f"GPU {g.index} is {g.name!r}" for g in gpus if g.name.strip().lower() != want.lower()]
    assert not wrong, f"expected {want!r}: {logic.summarize(wrong)}"
    mem = hostcfg.gpu.memory_mib
    if mem:
        off = [f"GPU {g.index} has {g.total_mib} MiB" for g in gpus if abs(g.total_mib - mem) > 0.02 * mem]
        assert not off, f"expected {mem} MiB per GPU: {logic.summarize(off)}"
    detail(f"{want}" + (f", {mem} MiB" if mem else ""))


def test_gpu_driver(hostcfg, probe, detail):
    gpus = probe.gpus()
    lo, hi = hostcfg.gpu.driver_min, hostcfg.gpu.driver_max
    versions = sorted({g.driver for g in gpus})
    bad = []
    for v in versions:
        try:
            if not logic.driver_in_range(v, lo, hi):
                bad.append(v)
        except ValueError:
            bad.append(v)
    rng = f"{lo or 'any'}..{hi or 'any'}"
    assert not bad, f"driver {', '.join(bad)} is outside the supported range {rng}"
    detail(f"driver {', '.join(versions)} in {rng}")


def test_gpu_no_leftover_processes(hostcfg, probe, detail):
    apps = probe.compute_apps()
    pids = {a.pid for a in apps}
    own = probe.owned(pids)
    foreign = logic.foreign_apps(apps, own)
    if foreign:
        fpids = {a.pid for a in foreign}
        names = probe.describe_pids(fpids)
        gpus_of: dict[int, list[str]] = {}
        mib_of: dict[int, int] = {}
        uuid_index = {g.uuid: g.index for g in probe.gpus()}
        for a in foreign:
            gpus_of.setdefault(a.pid, []).append(str(uuid_index.get(a.gpu_uuid, a.gpu_uuid)))
            mib_of[a.pid] = mib_of.get(a.pid, 0) + a.used_mib
        items = []
        for p in sorted(fpids):
            per_gpu = {a.used_mib for a in foreign if a.pid == p}
            held = (f"{per_gpu.pop()} MiB on each of GPU(s)" if len(per_gpu) == 1 and len(gpus_of[p]) > 1
                    else f"{mib_of[p]} MiB on GPU(s)")
            items.append(f"PID {p} ({names.get(p, 'exited?')}) holds {held} {','.join(gpus_of[p])}")
        pytest.fail(f"{len(fpids)} GPU process(es) not owned by {hostcfg.unit_name}: {logic.summarize(items)}",
                    pytrace=False)
    detail(f"no foreign GPU processes ({len(own)} of {hostcfg.unit_name}: not counted)" if own
           else "no GPU processes")


def test_gpu_free_memory(hostcfg, probe, detail):
    gpus = probe.gpus()
    apps = probe.compute_apps()
    own = probe.owned({a.pid for a in apps})
    free = logic.effective_free_mib(gpus, apps, own)
    need = hostcfg.gpu.min_free_mib
    low = [f"GPU {i}: {f} MiB free" for i, (f, _ours) in sorted(free.items()) if f < need]
    assert not low, f"{len(low)} GPU(s) below {need} MiB free (not counting {hostcfg.unit_name}): " \
                    f"{logic.summarize(low)}"
    least = min(f for f, _ in free.values())
    ours = sum(o for _, o in free.values())
    detail(f"min {least} MiB free per GPU (>= {need})" + (f"; {ours} MiB held by our service not counted" if ours
                                                          else ""))


def test_disk_space(host, hostcfg, probe, detail):
    root = str(hostcfg.install_root)
    r = probe.run(f"p={shlex.quote(root)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; df -P -k \"$p\"")
    assert r.rc == 0, f"df failed under {root}: {logic.one_line(r.stderr, 200)}"
    avail, mount = logic.df_avail_bytes(r.stdout)
    need = hostcfg.settings.min_free_disk_gib
    assert avail >= need * GIB, (f"{avail / GIB:.2f} GiB free on {mount} (holding {root}), "
                                 f"need {need:g} GiB for releases and weights")
    detail(f"{avail / GIB:.1f} GiB free on {mount} (>= {need:g})")


def test_model_path(host, hostcfg, probe, detail):
    path = str(hostcfg.model.path)
    if not host.file(path).is_directory:
        assert host.file(path).exists, f"model path {path} does not exist"
        pytest.fail(f"model path {path} is not a directory", pytrace=False)
    user = hostcfg.settings.service_user
    cfg = f"{path}/config.json"
    test = (f"test -e {shlex.quote(cfg)} || exit 3; "
            f"test -r {shlex.quote(path)} && test -x {shlex.quote(path)} && test -r {shlex.quote(cfg)} || exit 4")
    r = probe.run(f"runuser -u {shlex.quote(user)} -- sh -c {shlex.quote(test)}" if user else test)
    assert r.rc != 3, f"{cfg} does not exist (is {path} a complete checkpoint?)"
    assert r.rc == 0, f"{path} is not readable by {user or 'the SSH user'}"
    detail(f"{path} readable" + (f" by {user}" if user else ""))


def test_cuda_toolkit(host, hostcfg, probe, detail):
    extra = [f"{hostcfg.settings.extra_env['CUDA_HOME']}/bin"] if "CUDA_HOME" in hostcfg.settings.extra_env else []
    extra.append("/usr/local/cuda/bin")
    try:
        nvcc = host.find_command("nvcc", extrapaths=extra)
    except ValueError:
        pytest.fail(f"nvcc not found (PATH, {', '.join(extra)}): SGLang's JIT kernels need the CUDA toolkit",
                    pytrace=False)
    r = probe.run(f"{shlex.quote(nvcc)} --version")
    assert r.rc == 0, f"{nvcc} --version failed (exit {r.rc}): {logic.one_line(r.stderr, 200)}"
    release = next((ln.strip() for ln in r.stdout.splitlines() if "release" in ln), "version unknown")
    detail(f"{nvcc}: {release}")


def test_service_port(host, hostcfg, probe, detail):
    port = hostcfg.http_port
    listening = [s for s in host.socket.get_listening_sockets()
                 if s.startswith("tcp://") and s.rsplit(":", 1)[-1] == str(port)]
    if not listening:
        detail(f"port {port} is free")
        return
    r = probe.run(f"ss -Hltnp 'sport = :{port}'")
    pids = logic.ss_pids(r.stdout)
    own = probe.owned(pids)
    others = pids - own
    if others or not pids:
        names = probe.describe_pids(others)
        who = ", ".join(f"PID {p} ({names.get(p, '?')})" for p in sorted(others)) or "an unknown process"
        pytest.fail(f"port {port} is taken by {who}, not by {hostcfg.unit_name}", pytrace=False)
    detail(f"port {port} is held by our service (PID {', '.join(map(str, sorted(own)))})")


def test_time_sync(host, hostcfg, probe, detail):
    r = probe.run("echo NTP=$(timedatectl show -p NTPSynchronized --value 2>/dev/null); "
                  "echo CHRONY=$(chronyc -n tracking 2>/dev/null | sed -n 's/^Leap status *: *//p'); "
                  "echo VIRT=$(systemd-detect-virt --container 2>/dev/null)")
    facts = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    if facts.get("NTP", "").strip() == "yes":
        detail("NTP synchronized (timedatectl)")
        return
    if facts.get("CHRONY", "").strip().lower() == "normal":
        detail("NTP synchronized (chrony: leap status normal)")
        return
    t0 = time.time()
    remote = probe.run("date +%s.%N").stdout.strip()
    t1 = time.time()
    try:
        offset = float(remote) - (t0 + t1) / 2
    except ValueError:
        pytest.fail(f"cannot read the host's clock (date printed {remote!r})", pytrace=False)
    slack = (t1 - t0) / 2
    virt = facts.get("VIRT", "").strip()
    if virt and virt != "none":
        assert abs(offset) <= MAX_CLOCK_SKEW_S + slack, (
            f"container ({virt}) clock is {offset:+.2f}s off the controller's (max {MAX_CLOCK_SKEW_S}s)")
        detail(f"container ({virt}): the clock is the host kernel's, no NTP status inside; "
               f"offset vs controller {offset:+.3f}s")
        return
    pytest.fail(f"the clock is not NTP-synchronized (timedatectl NTPSynchronized="
                f"{facts.get('NTP', '').strip() or '?'}, no chrony); offset vs controller {offset:+.2f}s",
                pytrace=False)
