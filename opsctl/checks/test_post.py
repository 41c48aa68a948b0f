"""Post-deploy host checks: is the live release what opsctl put there, and does it serve?

Each test is one check, run once per inventory host; each passes or fails on its own.
"""
from __future__ import annotations

import hashlib
import json
import shlex

import pytest

from opsctl.checks import logic
from opsctl.checks.plugin import load_json


def _live(probe, hostcfg):
    """(release id, manifest) of the live release; fails the check when nothing is live."""
    state = probe.state()
    if not state.current:
        pytest.fail(f"no release is live: {hostcfg.install_root}/current is missing", pytrace=False)
    info = state.releases.get(state.current)
    if info is None:
        pytest.fail(f"current -> {state.current}, which has no manifest.json "
                    f"(incomplete or removed release)", pytrace=False)
    return state.current, info.manifest


def test_unit_active(host, hostcfg, probe, detail):
    if not host.service(hostcfg.unit_name).is_running:
        p = probe.show("ActiveState", "SubState", "Result", "LoadState")
        state = f"{p['ActiveState'] or '?'}/{p['SubState'] or '?'}"
        pytest.fail(f"{hostcfg.unit_name} is {state} (result {p['Result'] or '?'}"
                    + (", not installed)" if p["LoadState"] == "not-found" else ")"), pytrace=False)
    p = probe.show("MainPID", "ActiveEnterTimestamp")
    detail(f"active since {p['ActiveEnterTimestamp'] or '?'} (PID {p['MainPID'] or '?'})")


def test_unit_enabled(host, hostcfg, probe, detail):
    try:
        enabled = host.service(hostcfg.unit_name).is_enabled
    except RuntimeError:
        enabled = None
    if not enabled:
        r = host.run(f"systemctl is-enabled {shlex.quote(hostcfg.unit_name)}")
        state = r.stdout.strip() or logic.one_line(r.stderr, 120) or f"exit {r.rc}"
        pytest.fail(f"{hostcfg.unit_name} is " + ("not installed" if enabled is None else "not enabled")
                    + f" ({state})", pytrace=False)
    detail(f"{hostcfg.unit_name} is enabled ({probe.show('UnitFileState')['UnitFileState'] or '?'})")


def test_unit_no_restarts(hostcfg, probe, detail):
    p = probe.show("NRestarts", "ActiveState", "ActiveEnterTimestamp")
    n = p["NRestarts"]
    assert n.isdigit(), f"cannot read NRestarts of {hostcfg.unit_name} ({n!r})"
    assert int(n) == 0, (f"{hostcfg.unit_name} was restarted {n} time(s) by systemd since the release started "
                         f"(last start {p.get('ActiveEnterTimestamp', '?')})")
    detail("NRestarts=0")


def test_unit_file_matches_render(host, hostcfg, probe, detail):
    from opsctl.config import Profile
    from opsctl.render import render

    release, manifest = _live(probe, hostcfg)
    try:
        profile = Profile(**manifest["profile"])
    except Exception as exc:  # noqa: BLE001 - an unreadable manifest is the failure to report
        pytest.fail(f"release {release}: cannot rebuild its profile from manifest.json: "
                    f"{logic.one_line(str(exc), 150)}", pytrace=False)
    expected = render(hostcfg, profile).release_files[hostcfg.unit_name]
    link = f"/etc/systemd/system/{hostcfg.unit_name}"
    want_target = f"{hostcfg.install_root}/current/{hostcfg.unit_name}"
    f = host.file(link)
    problems = []
    target = host.run(f"readlink {shlex.quote(link)}")
    if target.rc != 0:  # not a symlink
        assert f.exists, f"{link} does not exist"
        problems.append(f"{link} is a regular file, not a link to {want_target}")
    elif target.stdout.strip() != want_target:
        problems.append(f"{link} -> {target.stdout.strip()}, expected -> {want_target}")
    actual = f.content_string
    drift = logic.unit_drift(expected, actual)
    if drift:
        deployed = (manifest.get("files") or {}).get(hostcfg.unit_name)
        if deployed and hashlib.sha256(actual.encode()).hexdigest() == deployed:
            problems.append(f"the file is as deployed, but opsctl now renders it differently (inventory or "
                            f"opsctl changed since): {logic.summarize(drift)}")
        else:
            problems.append(f"{link} differs from the render of {release} in {len(drift)} line(s): "
                            f"{logic.summarize(drift)}")
        reload = probe.show("NeedDaemonReload").get("NeedDaemonReload")
        if reload == "yes":
            problems.append("systemd has not loaded the edited file yet (NeedDaemonReload=yes)")
    assert not problems, "; ".join(problems)
    detail(f"{link} -> {want_target} matches the render of {release}")


def test_current_matches_ledger(hostcfg, probe, detail):
    state = probe.state()
    rec = logic.last_switch_record(state.ledger)
    root = hostcfg.install_root
    if rec is None:
        assert state.current is None, f"{root}/current -> {state.current}, but the ledger records no deploy"
        detail("no release deployed yet (no current, empty ledger)")
        return
    want = rec.get("to_release")
    what = f"{rec.get('action')} {rec.get('result', '')}".strip() + f" at {rec.get('ts', '?')}"
    if want is None:
        assert state.current is None, (f"{root}/current -> {state.current}, but the ledger's last record "
                                       f"({what}) left no release live")
        detail(f"nothing live, as the ledger's last record ({what}) says")
        return
    assert state.current == want, (f"{root}/current -> {state.current or 'nothing'}, but the ledger's last "
                                   f"record ({what}) says {want}")
    detail(f"current -> {want} ({what})")


_HASH_SCRIPT = r"""
import hashlib, json, os, sys
base, rels = sys.argv[1], json.loads(sys.argv[2])
out = {}
for rel in rels:
    p = os.path.join(base, rel)
    try:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        out[rel] = {"size": os.path.getsize(p), "sha256": h.hexdigest()}
    except OSError as e:
        out[rel] = {"error": e.strerror or str(e)}
print(json.dumps(out))
"""


def test_drafter_checksums(host, hostcfg, probe, detail):
    release, manifest = _live(probe, hostcfg)
    drafter = manifest.get("drafter")
    if not drafter:
        pytest.skip(f"release {release} ({manifest.get('profile', {}).get('name', '?')}) uses no drafter weights")
    digest = drafter["digest"]
    root = hostcfg.install_root
    ddir = f"{root}/shared/drafters/{digest}"
    mfile = host.file(f"{ddir}/manifest.json")
    try:
        text = mfile.content_string
    except Exception:  # noqa: BLE001 - testinfra raises when cat fails
        pytest.fail(f"{ddir}/manifest.json is missing (drafter of {release})", pytrace=False)
    dm = load_json(text, f"{ddir}/manifest.json")
    files: dict = dm.get("files") or {}
    assert files, f"{ddir}/manifest.json lists no files"
    problems = []
    if host.file(f"{root}/current/drafter").linked_to != ddir:
        problems.append(f"{root}/current/drafter does not point at {ddir}")
    if dm.get("digest") and dm["digest"] != digest:
        problems.append(f"{ddir}/manifest.json says digest {dm['digest'][:12]}, the release wants {digest[:12]}")
    from opsctl.artifacts import DrafterManifest

    if DrafterManifest(files).digest != digest:  # the file list itself edited (a hash or size changed with a file)
        problems.append(f"{ddir}/manifest.json lists other files or hashes than the release's digest {digest[:12]} names")
    py = str(hostcfg.host_python)
    r = probe.run(f"{shlex.quote(py)} -c {shlex.quote(_HASH_SCRIPT)} {shlex.quote(ddir)} "
                  f"{shlex.quote(json.dumps(sorted(files)))}", timeout=1800)
    assert r.rc == 0, f"hashing the drafter on the host failed (exit {r.rc}): {logic.one_line(r.stderr, 200)}"
    got = load_json(r.stdout, "the host's checksum report")
    for rel in sorted(files):
        want, have = files[rel], got.get(rel, {})
        if "error" in have:
            problems.append(f"{rel}: {have['error']}")
        elif have.get("size") != want.get("size"):
            problems.append(f"{rel}: {have.get('size')} bytes, manifest says {want.get('size')}")
        elif have.get("sha256") != want.get("sha256"):
            problems.append(f"{rel}: sha256 {str(have.get('sha256'))[:12]}, manifest says "
                            f"{str(want.get('sha256'))[:12]}")
    assert not problems, f"drafter {digest[:12]} of {release}: {logic.summarize(problems)}"
    total = sum(int(v.get("size", 0)) for v in files.values())
    detail(f"{len(files)} file(s), {total / 2**20:.1f} MiB match manifest {digest[:12]}")


def test_release_files_checksums(hostcfg, probe, detail):
    """The live release's rendered files and runtime tree by full sha256 against its manifest
    (the drafter: test_drafter_checksums), an added file in site/ included (issue #32 item 9)."""
    from opsctl.integrity import parse_report, verify_command

    release, _ = _live(probe, hostcfg)
    r = probe.run(verify_command(hostcfg, release, drafter="none"), timeout=1800)
    report = parse_report(release, r.stdout)
    assert report is not None, (f"checking the files of {release} on the host failed (exit {r.rc}): "
                                f"{logic.one_line(r.stderr, 200)}")
    assert report.ok, f"release {release} differs from its manifest: {logic.summarize(report.problems)}"
    detail(f"{report.checked()} of {release} match its manifest")


def test_port_listening(host, hostcfg, probe, detail):
    port = hostcfg.http_port
    bind = hostcfg.settings.bind_address
    assert host.socket(f"tcp://{bind}:{port}").is_listening, f"nothing listens on {bind}:{port}"
    pids = logic.ss_pids(probe.run(f"ss -Hltnp 'sport = :{port}'").stdout)
    own = probe.owned(pids)
    others = pids - own
    if others:
        names = probe.describe_pids(others)
        pytest.fail(f"port {port} is held by " + ", ".join(f"PID {p} ({names.get(p, '?')})" for p in sorted(others))
                    + f", not by {hostcfg.unit_name}", pytrace=False)
    detail(f"{bind}:{port} listening (PID {', '.join(map(str, sorted(own))) or '?'})")


# http.client, not urllib: urllib sends "Connection: close", so the server closes first and keeps
# a TIME_WAIT socket on its port, which (without SO_REUSEADDR) can block its next bind
_HEALTH_SCRIPT = """
import http.client, sys
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    c.request("GET", "/health_generate")
    r = c.getresponse()
    r.read()
    c.close()
    print(r.status)
except Exception as e:
    print("0 " + type(e).__name__ + ": " + str(e))
"""


def test_health_generate(hostcfg, probe, detail):
    bind = hostcfg.settings.bind_address
    addr = "127.0.0.1" if bind in ("0.0.0.0", "", "*") else ("[::1]" if bind == "::" else bind)
    url = f"http://{addr}:{hostcfg.http_port}/health_generate"
    r = probe.run(f"{shlex.quote(str(hostcfg.host_python))} -c {shlex.quote(_HEALTH_SCRIPT)} "
                  f"{shlex.quote(addr.strip('[]'))} {hostcfg.http_port} 60", timeout=90)
    code = r.stdout.strip()
    assert code == "200", f"GET {url} on the host: {code or r.stderr.strip() or 'no answer'}"
    detail(f"GET {url}: 200")


def test_journal_ready(hostcfg, probe, detail):
    j = probe.journal()
    assert j["ready"] > 0, (f"this start of {hostcfg.unit_name} (invocation {j['invocation'][:12]}, "
                            f"{j['lines']} journal lines) has no ready line")
    detail(f"ready line logged (invocation {j['invocation'][:12]})")


def test_journal_no_capture_failure(hostcfg, probe, detail):
    j = probe.journal()
    assert not j["failures"], (f"this start of {hostcfg.unit_name} logged a CUDA-graph capture failure: "
                               f"{logic.one_line(j['failures'][0], 200)}")
    detail(f"no capture failure in {j['lines']} journal lines of this start")


def test_ddtree_serves_what_the_release_means(hostcfg, probe, detail):
    """What the DDTree runtime serves (its /server_info) is what the live release means: its budget or
    schedule, a trial release the candidate its ledger records (issue #50 item 2)."""
    from opsctl import serving

    release, _ = _live(probe, hostcfg)
    state = probe.state()
    want = serving.intended(state.releases.get(release), state.ledger)
    if want is None:
        detail(f"{release} is not a DDTree release: nothing to compare")
        return
    fact = serving.ServingDDTree(str(hostcfg.host_python), hostcfg.http_port)
    got = fact.process(probe.run(fact.command(), timeout=60).stdout)
    assert got is not None, (f"GET /server_info on the host names no DDTree candidate serving "
                             f"({release} means {want})")
    refused = f"; the runtime refused a control file: {got['last_refusal']}" if got.get("last_refusal") else ""
    assert serving.same(str(got["active"]), want), (f"the runtime serves DDTree {got['active']} (its /server_info), "
                                                    f"but {release} means {want}{refused}")
    detail(f"the runtime serves DDTree {got['active']}, as {release} means{refused}")
