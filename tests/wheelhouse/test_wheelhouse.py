"""opsctl wheelhouse build/verify and opsctl runtime build on a small real set (PyPI + the
runtime wheel). Needs the package index (PyPI); no lab host."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.pylock import Pylock

from whset import PLATFORM, PYTHON, REQUIREMENTS
from opsctl import wheelhouse as wh
from opsctl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def opsctl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opsctl", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600, env={**os.environ, **(env or {})})


# --------------------------------------------------------------------------- target and tags (pure)


def test_manylinux_2_34_accepts_older_manylinux_wheels_and_nothing_newer():
    t = wh.Target("3.11", "manylinux_2_34_x86_64")
    plats = t.platforms()
    assert plats[0] == "manylinux_2_34_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_28_x86_64"} <= set(plats)
    assert not any(p.startswith(("manylinux_2_35", "manylinux_2_39")) for p in plats)
    assert all(p.endswith("_x86_64") for p in plats)
    assert wh.wheel_min_glibc("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl") == (2, 28)
    assert wh.wheel_min_glibc("x-1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl") == (2, 17)
    assert wh.wheel_min_glibc("six-1.16.0-py2.py3-none-any.whl") is None


@pytest.mark.parametrize("python,platform,needle", [("3", PLATFORM, "--python"), ("3.11", "win_amd64", "--platform"),
                                                    ("3.11", "manylinux_2_34", "--platform")])
def test_bad_target_is_bad_input_with_the_fix(python, platform, needle):
    with pytest.raises(ConfigError) as exc:
        wh.Target(python, platform)
    assert needle in exc.value.problem and exc.value.fix


def test_bad_target_on_the_command_line_exits_2_in_one_line(tmp_path):
    proc = opsctl("wheelhouse", "build", "--sglang", "0.5.23", "--python", "3.11", "--platform", "macosx_14_0_arm64",
                  "--out", str(tmp_path / "wh"))
    assert proc.returncode == 2, proc.stderr
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "macosx_14_0_arm64" in err[0] and "(fix:" in err[0]
    assert not (tmp_path / "wh").exists()


def test_a_target_the_controller_cannot_resolve_for_is_refused():
    other = "3.12" if sys.version_info[:2] != (3, 12) else "3.10"
    with pytest.raises(ConfigError) as exc:
        wh.resolve(["six==1.16.0"], wh.Target(other, PLATFORM))
    assert "markers" in exc.value.problem


# --------------------------------------------------------------------------- build, lock


def test_build_writes_a_valid_pep751_lock_with_every_files_sha256_and_size(small_set, runtime_wheel):
    out, res = small_set
    data = tomllib.loads((out / wh.LOCK_NAME).read_text())
    lock = Pylock.from_dict(data)          # packaging's own PEP 751 validation
    names = {str(p.name) for p in lock.packages}
    assert names == {"six", "attrs", "markupsafe", "sglang-ddtree"}
    for pkg in lock.packages:
        (w,) = pkg.wheels
        f = out / w.filename
        assert f.is_file() and f.stat().st_size == w.size
        assert wh.sha256_file(f) == w.hashes["sha256"]
    runtime = next(p for p in data["packages"] if p["name"] == "sglang-ddtree")
    assert runtime["tool"]["opsctl"]["no-deps"] is True and runtime["wheels"][0]["path"] == runtime_wheel.name
    assert data["tool"]["opsctl"] == {"python": PYTHON, "platform": PLATFORM, "requirements": REQUIREMENTS,
                                      "index-url": wh.PYPI}
    # what packaging selects from the lock for the target is exactly the set on disk
    t = wh.Target(PYTHON, PLATFORM)
    picked = {w.filename for _, w in lock.select(environment=t.environment(), tags=t.tags())}
    assert picked == {p.name for p in out.glob("*.whl")}
    assert len(res.downloaded) == 3 and res.downloaded_bytes > 0


def test_second_build_downloads_nothing_and_does_not_resolve_again(small_set, wh_copy, runtime_wheel, monkeypatch):
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in wh_copy.glob("*.whl")}

    def no_resolution(*a, **kw):
        raise AssertionError("resolved again although the lock was made for the same target and requirements")

    monkeypatch.setattr(wh, "resolve", no_resolution)
    monkeypatch.setattr(wh, "_download", no_resolution)
    res = wh.build(wh_copy, REQUIREMENTS, wh.Target(PYTHON, PLATFORM), add=[runtime_wheel])
    assert res.reused_lock and res.downloaded == [] and res.downloaded_bytes == 0
    assert len(res.present) == 4
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in wh_copy.glob("*.whl")} == before
    assert (wh_copy / wh.LOCK_NAME).read_text() == (small_set[0] / wh.LOCK_NAME).read_text()


def test_refresh_or_other_requirements_resolve_again(wh_copy, runtime_wheel, monkeypatch):
    calls = []
    real = wh.resolve
    monkeypatch.setattr(wh, "resolve", lambda *a, **kw: calls.append(a[0]) or real(*a, **kw))
    res = wh.build(wh_copy, REQUIREMENTS, wh.Target(PYTHON, PLATFORM), add=[runtime_wheel], refresh=True)
    assert calls == [REQUIREMENTS] and not res.reused_lock and res.downloaded == []
    res = wh.build(wh_copy, ["six==1.16.0"], wh.Target(PYTHON, PLATFORM))
    assert calls[-1] == ["six==1.16.0"] and not res.reused_lock
    assert len(res.removed) == 3 and not any(p.startswith("six-") for p in res.removed)
    assert [p.name for p in wh_copy.glob("*.whl")] == ["six-1.16.0-py2.py3-none-any.whl"] and wh.verify(wh_copy).ok


def test_build_fetches_again_only_the_file_that_changed(wh_copy, runtime_wheel):
    six = next(wh_copy.glob("six-*.whl"))
    st = six.stat()
    data = bytearray(six.read_bytes())
    data[100] ^= 0xFF
    six.write_bytes(bytes(data))
    os.utime(six, ns=(st.st_atime_ns, st.st_mtime_ns))   # same size, same mtime
    res = wh.build(wh_copy, REQUIREMENTS, wh.Target(PYTHON, PLATFORM), add=[runtime_wheel])
    assert res.downloaded == [six.name]
    assert wh.verify(wh_copy).ok


def test_dry_run_sizes_the_set_and_writes_nothing(tmp_path):
    out = tmp_path / "wh"
    res = wh.build(out, ["six==1.16.0"], wh.Target(PYTHON, PLATFORM), dry_run=True)
    assert not out.exists()
    (e,) = res.entries
    assert e.filename == "six-1.16.0-py2.py3-none-any.whl" and e.size == 11053 and res.total_bytes == 11053


def test_pip_configuration_of_this_machine_does_not_leak_into_the_set(tmp_path):
    """A pip config file and PIP_* settings that would change the set (a constraint, a
    local find-links) are ignored; only transport settings pass through."""
    (tmp_path / "c.txt").write_text("six<1.16\n")
    (tmp_path / "links").mkdir()
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nconstraint = {tmp_path / 'c.txt'}\nfind-links = {tmp_path / 'links'}\n")
    env = {"PIP_CONFIG_FILE": str(conf), "PIP_CONSTRAINT": str(tmp_path / "c.txt"), "PIP_INDEX_URL": "http://127.0.0.1:9/"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        entries = wh.resolve(["six==1.16.0"], wh.Target(PYTHON, PLATFORM))
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert [(e.name, e.version) for e in entries] == [("six", "1.16.0")]
    assert entries[0].url.startswith("https://")


# --------------------------------------------------------------------------- verify


def test_verify_passes_on_the_built_set(small_set):
    proc = opsctl("wheelhouse", "verify", str(small_set[0]), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] and out["packages"] == 4 and out["problems"] == [] and out["offline_resolution"]["ok"]


def test_a_tampered_file_fails_verify_and_is_named(wh_copy):
    attrs = next(wh_copy.glob("attrs-*.whl"))
    st = attrs.stat()
    data = bytearray(attrs.read_bytes())
    data[-10] ^= 0x01                                  # same size,
    attrs.write_bytes(bytes(data))
    os.utime(attrs, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: only the content says
    proc = opsctl("wheelhouse", "verify", str(wh_copy), "--json")
    assert proc.returncode == 6, proc.stderr
    out = json.loads(proc.stdout)
    assert [p["file"] for p in out["problems"]] == [attrs.name]
    assert "sha256" in out["problems"][0]["problem"]
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and attrs.name in err[0]


def test_a_missing_file_fails_verify_and_is_named(wh_copy):
    six = next(wh_copy.glob("six-*.whl"))
    six.unlink()
    proc = opsctl("wheelhouse", "verify", str(wh_copy))
    assert proc.returncode == 6
    assert f"FAIL {six.name}: missing" in proc.stdout
    assert six.name in proc.stderr and "(fix:" in proc.stderr
    res = wh.verify(wh_copy)
    assert res.problems == [{"file": six.name, "problem": "missing"}]
    assert not res.resolver_ok and "six" in res.resolver_error   # and pip cannot install the set offline


def test_an_unlocked_wheel_beside_the_set_fails_verify(wh_copy, small_set):
    extra = wh_copy / "six-1.17.0-py2.py3-none-any.whl"
    extra.write_bytes(next(small_set[0].glob("six-*.whl")).read_bytes())
    res = wh.verify(wh_copy)
    assert [p["file"] for p in res.problems] == [extra.name]


def test_verify_without_a_lock_is_bad_input(tmp_path):
    (tmp_path / "six-1.16.0-py2.py3-none-any.whl").write_bytes(b"x")
    proc = opsctl("wheelhouse", "verify", str(tmp_path))
    assert proc.returncode == 2 and "pylock.toml" in proc.stderr and "(fix:" in proc.stderr


# --------------------------------------------------------------------------- host compatibility (pure)


def test_host_with_old_glibc_is_refused_with_the_exact_requirement(small_set):
    lock = wh.read_lock(small_set[0])
    refusal = wh.host_refusal(lock, wh.HostPython("3.11", "x86_64", "2.12"), "gpu1")
    assert refusal is not None
    problem, fix = refusal
    assert "glibc 2.12" in problem and "glibc >= 2.17" in problem and "MarkupSafe-2.1.5" in problem
    assert "nothing was shipped" in problem and "--platform manylinux_2_12_x86_64" in fix
    assert wh.host_refusal(lock, wh.HostPython("3.11", "x86_64", "2.17"), "gpu1") is None
    assert wh.host_refusal(lock, wh.HostPython("3.11", "x86_64", "2.36"), "gpu1") is None


def test_host_with_another_python_is_refused(small_set):
    lock = wh.read_lock(small_set[0])
    problem, fix = wh.host_refusal(lock, wh.HostPython("3.10", "x86_64", "2.36"), "gpu1")
    assert "Python 3.10" in problem and "MarkupSafe" in problem and "--python 3.10" in fix
    problem, _ = wh.host_refusal(lock, wh.HostPython("3.11", "aarch64", "2.36"), "gpu1")
    assert "aarch64" in problem


# --------------------------------------------------------------------------- runtime build


def test_runtime_build_is_reproducible_and_is_what_the_script_builds(tmp_path):
    a = opsctl("runtime", "build", "--out", str(tmp_path / "a"), "--json")
    b = opsctl("runtime", "build", "--out", str(tmp_path / "b"), "--json")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja["sha256"] == jb["sha256"] and ja["name"].startswith("sglang_ddtree-")
    assert wh.sha256_file(Path(ja["path"])) == ja["sha256"]
    script = subprocess.run([str(REPO / "scripts" / "build-runtime-wheel"), str(tmp_path / "c")], capture_output=True,
                            text=True, env={**os.environ, "PYTHON": sys.executable}, timeout=300)
    assert script.returncode == 0, script.stderr
    assert wh.sha256_file(Path(script.stdout.strip())) == ja["sha256"]


# --------------------------------------------------------------------------- deploy's plan, before any host I/O


class NoHost:
    """A connection that must not be used."""

    def run(self, command, **kw):
        raise AssertionError(f"the host was contacted: {command}")

    put = get = run


def _lab_host_with(wheelhouse: Path, requirements=("six==1.16.0",)):
    from opsctl.config import load_inventory

    host = load_inventory(REPO / "inventories" / "lab").hosts["lab"]
    s = host.settings
    runtime = s.runtime.model_copy(update={"wheelhouse": wheelhouse, "base_requirements": tuple(requirements)})
    return host.model_copy(update={"settings": s.model_copy(update={"runtime": runtime})})


def test_deploy_plan_refuses_a_wheelhouse_without_lock_or_not_matching_it_before_touching_the_host(wh_copy):
    with pytest.raises(ConfigError, match="no pylock.toml"):
        wh.plan_base_env(NoHost(), _lab_host_with(wh_copy.parent))   # a directory without a lock
    six = next(wh_copy.glob("six-*.whl"))
    six.write_bytes(b"not a wheel")
    with pytest.raises(ConfigError) as exc:
        wh.plan_base_env(NoHost(), _lab_host_with(wh_copy))
    assert six.name in exc.value.problem and "opsctl wheelhouse verify" in exc.value.fix
    wh.build(wh_copy, ["six==1.16.0"], wh.Target(PYTHON, PLATFORM))   # back to a consistent set of one
    with pytest.raises(ConfigError) as exc:
        wh.plan_base_env(NoHost(), _lab_host_with(wh_copy, ("sglang==0.5.23",)))
    assert "no sglang" in exc.value.problem
