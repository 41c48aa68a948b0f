"""The base environment's wheels for an air-gapped host: resolve, download, lock, verify, ship.

A wheelhouse is a directory of wheels with a PEP 751 lock beside them (`pylock.toml`:
every file's name, URL or path, size and sha256). It is built on the controller for one
target (CPython version + platform tag, e.g. 3.11 / manylinux_2_34_x86_64):

- resolve: pip's resolver for the target (`pip install --dry-run --report`, wheels only,
  `--platform`/`--python-version`, range requests for metadata so nothing large is
  fetched), isolated from pip's configuration files and resolution settings (a machine's
  constraints or local find-links must not change what the host gets);
- download: only files not already present with the locked sha256 (`pip download
  --require-hashes`), into a temporary name, checked, then renamed; a re-run for the same
  target and requirements reuses the lock (no resolution, no drift, no network when every
  file is present) unless asked to `refresh`;
- local wheels (the runtime wheel, the lab's emulator) join the set as they are,
  without their dependencies (`no-deps`);
- verify: every file matches the lock, nothing unlocked lies beside it, and pip's
  resolver finds the whole set in the directory alone (`--no-index`) for the target;
- ship (deploy): the host's Python and glibc are checked against every wheel's tags
  first, then the files go by the drafter's content sync (opsctl.artifacts) into
  `<root>/shared/wheelhouses/<digest>/`, files the host already has are hard-linked.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import platform as _platform
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

import tomli_w
from packaging.markers import default_environment
from packaging.pylock import Pylock, PylockValidationError
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from opsctl import __version__
from opsctl.artifacts import DrafterManifest, SyncResult, _hash_cache, plan_drafter, sha256_file, sync_drafter
from opsctl.errors import CheckFailed, ConfigError, HostError

LOCK_NAME = "pylock.toml"
PYPI = "https://pypi.org/simple"
# pip settings that only say how to reach the index; everything else (constraints,
# find-links, extra indexes, pre-releases) would change the set and is dropped
TRANSPORT_ENV = ("PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT",
                 "PIP_RETRIES", "PIP_TIMEOUT")
# manylinux2014 etc. are aliases of manylinux_2_17 etc. (PEP 600)
_LEGACY_MANYLINUX = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}
Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# --------------------------------------------------------------------------- target


@dataclass(frozen=True)
class Target:
    """What the host runs: a CPython version and a platform tag."""

    python: str = "3.11"
    platform: str = "manylinux_2_34_x86_64"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d{1,2}", self.python):
            raise ConfigError(f"--python {self.python!r} is not a CPython version like 3.11",
                              "pass the host's Python as MAJOR.MINOR, e.g. --python 3.11")
        if not re.fullmatch(r"(manylinux_\d+_\d+|manylinux2014|manylinux2010|manylinux1|linux)_(x86_64|aarch64|"
                            r"ppc64le|s390x|i686|armv7l)", self.platform):
            raise ConfigError(f"--platform {self.platform!r} is not a Linux platform tag",
                              "pass one like manylinux_2_34_x86_64 (glibc 2.34 or newer, x86_64)")

    @property
    def arch(self) -> str:
        return re.fullmatch(r"(?:manylinux_\d+_\d+|manylinux\d+|linux)_(.+)", self.platform).group(1)

    @property
    def glibc(self) -> tuple[int, int] | None:
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_.+", self.platform)
        if m:
            return int(m.group(1)), int(m.group(2))
        for ver, alias in _LEGACY_MANYLINUX.items():
            if self.platform.startswith(alias + "_"):
                return ver
        return None

    @property
    def interpreter(self) -> str:
        return "cp" + self.python.replace(".", "")

    def platforms(self) -> list[str]:
        """Every platform tag a host of this glibc and arch accepts, newest first."""
        glibc = self.glibc
        if glibc is None:  # linux_<arch>: a non-portable wheel built for one machine
            return [self.platform]
        major, minor = glibc
        out = []
        for m in range(minor, 4, -1):
            out.append(f"manylinux_{major}_{m}_{self.arch}")
            if (major, m) in _LEGACY_MANYLINUX:
                out.append(f"{_LEGACY_MANYLINUX[(major, m)]}_{self.arch}")
        return out

    def tags(self) -> list[Tag]:
        version = tuple(int(x) for x in self.python.split("."))
        plats = self.platforms()
        return [*cpython_tags(version, platforms=plats), *compatible_tags(version, self.interpreter, plats)]

    def environment(self) -> dict[str, str]:
        """Marker environment of the target (for selecting from the lock)."""
        env = default_environment()
        env.update(python_version=self.python, python_full_version=f"{self.python}.0", sys_platform="linux",
                   platform_system="Linux", os_name="posix", platform_machine=self.arch,
                   implementation_name="cpython", platform_python_implementation="CPython")
        return env

    def pip_args(self) -> list[str]:
        args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", self.python]
        for p in self.platforms():
            args += ["--platform", p]
        return args

    def check_resolvable_here(self) -> None:
        """pip evaluates environment markers with the interpreter it runs under: resolve
        only where they agree with the target, or the set would be wrong without an error."""
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if here != self.python:
            raise ConfigError(f"the wheelhouse is for Python {self.python}, but opsctl runs on Python {here}: "
                              "pip evaluates dependency markers with the interpreter that resolves",
                              f"run opsctl from a Python {self.python} environment, or build for --python {here}")
        machine = _platform.machine()
        if machine != self.arch or sys.platform != "linux":
            raise ConfigError(f"the wheelhouse is for {self.arch} Linux, but this controller is {machine} "
                              f"{sys.platform}: pip evaluates dependency markers with this machine's values",
                              f"build the wheelhouse on a {self.arch} Linux controller")


def wheel_tags(filename: str) -> frozenset[Tag]:
    try:
        return parse_wheel_filename(filename)[3]
    except InvalidWheelFilename as exc:
        raise ConfigError(f"{filename} is not a wheel file name ({exc})", "pass a built .whl file") from None


def wheel_min_glibc(filename: str) -> tuple[int, int] | None:
    """The oldest glibc any of the wheel's platform tags accepts (None: not a glibc-bound wheel)."""
    best = None
    for tag in wheel_tags(filename):
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_.+", tag.platform)
        ver = (int(m.group(1)), int(m.group(2))) if m else next(
            (v for v, alias in _LEGACY_MANYLINUX.items() if tag.platform.startswith(alias + "_")), None)
        if ver is None:
            if tag.platform == "any":
                return None
            continue
        best = ver if best is None or ver < best else best
    return best


# --------------------------------------------------------------------------- the lock


@dataclass
class Entry:
    """One locked wheel."""

    name: str          # canonical distribution name
    version: str
    filename: str
    sha256: str
    size: int | None = None
    url: str | None = None       # where it came from (index download)
    no_deps: bool = False        # joined the set as a local file, without resolving its dependencies
    requested: bool = False

    def as_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "file": self.filename, "sha256": self.sha256,
                "size": self.size, "url": self.url, "no_deps": self.no_deps, "requested": self.requested}


@dataclass
class Lock:
    target: Target
    requirements: list[str]
    entries: list[Entry]
    index_url: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(e.size or 0 for e in self.entries)

    def to_toml(self) -> str:
        packages = []
        for e in sorted(self.entries, key=lambda e: e.name):
            wheel: dict = {"name": e.filename}
            if e.url:
                wheel["url"] = e.url
            else:
                wheel["path"] = e.filename  # relative to the lock's directory
            if e.size is not None:
                wheel["size"] = e.size
            wheel["hashes"] = {"sha256": e.sha256}
            pkg: dict = {"name": e.name, "version": e.version}
            if e.url and self.index_url:
                pkg["index"] = self.index_url
            pkg["wheels"] = [wheel]
            if e.no_deps:
                pkg["tool"] = {"opsctl": {"no-deps": True}}
            packages.append(pkg)
        data = {
            "lock-version": "1.0",
            "environments": [f"python_version == '{self.target.python}' and sys_platform == 'linux' "
                             f"and platform_machine == '{self.target.arch}'"],
            "requires-python": f"=={self.target.python}.*",
            "created-by": f"opsctl {__version__}",
            "packages": packages,
            "tool": {"opsctl": {"python": self.target.python, "platform": self.target.platform,
                                "requirements": list(self.requirements),
                                **({"index-url": self.index_url} if self.index_url else {})}},
        }
        Pylock.from_dict(data)  # what we write must be valid PEP 751
        return ("# PEP 751 lock of this wheelhouse, written by opsctl wheelhouse build; "
                "check it with opsctl wheelhouse verify\n" + tomli_w.dumps(data))


def read_lock(directory: Path) -> Lock:
    path = directory / LOCK_NAME
    if not directory.is_dir():
        raise ConfigError(f"wheelhouse {directory} does not exist",
                          "build it with 'opsctl wheelhouse build --out DIR' or point at the right directory")
    if not path.is_file():
        raise ConfigError(f"wheelhouse {directory} has no {LOCK_NAME}",
                          f"build it with 'opsctl wheelhouse build --out {directory}' (it writes the lock)")
    try:
        data = tomllib.loads(path.read_text())
        pylock = Pylock.from_dict(data)
    except (tomllib.TOMLDecodeError, PylockValidationError, ValueError) as exc:
        raise ConfigError(f"{path} is not a valid PEP 751 lock: {exc}",
                          f"rebuild it with 'opsctl wheelhouse build --out {directory}'") from None
    tool = (data.get("tool") or {}).get("opsctl") or {}
    if "python" not in tool or "platform" not in tool:
        raise ConfigError(f"{path} was not written by opsctl (no [tool.opsctl] python/platform)",
                          f"rebuild it with 'opsctl wheelhouse build --out {directory}'")
    entries = []
    for pkg, raw in zip(pylock.packages, data["packages"]):
        if not pkg.wheels or len(pkg.wheels) != 1 or "sha256" not in pkg.wheels[0].hashes:
            raise ConfigError(f"{path}: package {pkg.name} must have exactly one wheel with a sha256",
                              f"rebuild it with 'opsctl wheelhouse build --out {directory}'")
        w = pkg.wheels[0]
        entries.append(Entry(str(pkg.name), str(pkg.version), w.filename, w.hashes["sha256"], w.size, w.url,
                             bool(((raw.get("tool") or {}).get("opsctl") or {}).get("no-deps"))))
    return Lock(Target(tool["python"], tool["platform"]), list(tool.get("requirements", [])), entries,
                tool.get("index-url"))


# --------------------------------------------------------------------------- pip


def pip_env() -> dict[str, str]:
    """The environment pip runs in: no configuration files (/etc/pip.conf, a machine's
    constraints), no PIP_* resolution settings; transport settings pass through."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in TRANSPORT_ENV}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def _pip(args: list[str], *, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=pip_env(),
                          timeout=timeout)


def _pip_error(proc: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return " | ".join((errors or lines)[-3:])[:600]


def _url_filename(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])


def _check_requirements(requirements: list[str]) -> None:
    for r in requirements:
        try:
            Requirement(r)
        except InvalidRequirement as exc:
            raise ConfigError(f"requirement {r!r} is not valid: {exc}", "write it like sglang==0.5.23") from None


def resolve(requirements: list[str], target: Target, *, index_url: str = PYPI) -> list[Entry]:
    """The complete pinned set of wheels for `requirements` on `target`, from the index.
    Fetches metadata only (HTTP range requests), not the wheels."""
    _check_requirements(requirements)
    target.check_resolvable_here()
    with tempfile.TemporaryDirectory(prefix="opsctl-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        proc = _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--use-feature=fast-deps",
                     "--no-cache-dir", "--index-url", index_url, *target.pip_args(), "--report", str(report),
                     *requirements])
        if proc.returncode != 0 or not report.is_file():
            raise ConfigError(f"resolving {' '.join(requirements)} for Python {target.python} on {target.platform} "
                              f"failed: {_pip_error(proc)}",
                              "check the versions exist as wheels for that Python and platform (pip download "
                              "--only-binary=:all: shows which), or the index URL")
        data = json.loads(report.read_text())
    entries = []
    for item in data.get("install", []):
        info = item["download_info"]
        url = info["url"]
        sha = (info.get("archive_info") or {}).get("hashes", {}).get("sha256")
        meta = item["metadata"]
        filename = _url_filename(url)
        if not filename.endswith(".whl"):
            raise ConfigError(f"{meta['name']} {meta['version']} resolved to {filename}, not a wheel",
                              "only wheels can be installed offline; pin a version that ships a wheel")
        if not sha:
            raise ConfigError(f"the index gave no sha256 for {filename}", "use an index that publishes hashes (PyPI)")
        entries.append(Entry(canonicalize_name(meta["name"]), meta["version"], filename, sha, None, url,
                             requested=bool(item.get("requested"))))
    return sorted(entries, key=lambda e: e.name)


def local_entry(wheel: Path, target: Target) -> Entry:
    """A wheel on this machine joining the set without its dependencies (runtime, emulator)."""
    if not wheel.is_file():
        raise ConfigError(f"wheel {wheel} does not exist", "build it first (opsctl runtime build) or fix the path")
    tags = wheel_tags(wheel.name)
    name, version, _, _ = parse_wheel_filename(wheel.name)
    if not tags & set(target.tags()):
        raise ConfigError(f"{wheel.name} does not install on Python {target.python} / {target.platform}",
                          "add a wheel built for the target")
    return Entry(str(name), str(version), wheel.name, sha256_file(wheel), wheel.stat().st_size, None, no_deps=True,
                 requested=True)


def _remote_sizes(entries: list[Entry]) -> None:
    """Fill in sizes for a dry run: one HEAD request per file (the report has no sizes)."""
    import httpx

    cert = os.environ.get("PIP_CERT")
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=cert) if cert else True

    def head(e: Entry) -> None:
        if e.size is not None or not e.url:
            return
        if e.url.startswith("file://"):
            e.size = Path(e.url[7:]).stat().st_size
            return
        with httpx.Client(follow_redirects=True, timeout=60, verify=verify) as client:
            r = client.head(e.url)
            if r.status_code == 200 and r.headers.get("content-length"):
                e.size = int(r.headers["content-length"])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(head, entries))


# --------------------------------------------------------------------------- build


@dataclass
class BuildResult:
    directory: Path
    target: Target
    requirements: list[str]
    entries: list[Entry]
    dry_run: bool
    downloaded: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    present: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    resolve_s: float = 0.0
    download_s: float = 0.0
    reused_lock: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(e.size or 0 for e in self.entries)

    def as_dict(self) -> dict:
        return {"directory": str(self.directory), "lock": str(self.directory / LOCK_NAME) if not self.dry_run else None,
                "python": self.target.python, "platform": self.target.platform, "requirements": self.requirements,
                "dry_run": self.dry_run, "packages": len(self.entries), "total_bytes": self.total_bytes,
                "sizes_unknown": [e.filename for e in self.entries if e.size is None],
                "downloaded": self.downloaded, "downloaded_bytes": self.downloaded_bytes,
                "already_present": len(self.present), "removed": self.removed, "reused_lock": self.reused_lock,
                "resolve_s": round(self.resolve_s, 2), "download_s": round(self.download_s, 2),
                "wheels": [e.as_dict() for e in self.entries]}


def _matches(path: Path, e: Entry, cache: dict | None) -> bool:
    """Present with the locked size and sha256 (`cache`: trust a hash of the same path, size and mtime)."""
    return path.is_file() and (e.size is None or path.stat().st_size == e.size) and sha256_file(path, cache) == e.sha256


def _reusable_lock(out: Path | None, requirements: list[str], target: Target, index_url: str) -> Lock | None:
    """The lock already in `out` when it was made for the same target, requirements and index."""
    if out is None or not (out / LOCK_NAME).is_file():
        return None
    try:
        lock = read_lock(out)
    except ConfigError:
        return None
    same = (lock.target == target and lock.requirements == list(requirements)
            and (not requirements or lock.index_url == index_url))
    return lock if same else None


def build(out: Path | None, requirements: list[str], target: Target, *, add: list[Path] = (),
          index_url: str = PYPI, dry_run: bool = False, refresh: bool = False, say: Say = _quiet) -> BuildResult:
    """Resolve (or reuse the lock in `out` made for the same target and requirements, unless
    `refresh`), download what is missing, write the lock. `dry_run`: resolve and size only."""
    if not dry_run and out is None:
        raise ConfigError("no output directory", "pass --out DIR (or --dry-run)")
    t0 = time.monotonic()
    reuse = None if refresh else _reusable_lock(out, requirements, target, index_url)
    if reuse is not None:
        say(f"reusing {out / LOCK_NAME} (same target and requirements; --refresh resolves again)")
        entries = [dataclasses.replace(e, requested=False) for e in reuse.entries if not e.no_deps]
    else:
        entries = resolve(requirements, target, index_url=index_url) if requirements else []
    local_files = {Path(w).name: Path(w) for w in add}
    for wheel in add:
        local = local_entry(Path(wheel), target)
        if any(e.name == local.name for e in entries):
            raise ConfigError(f"{local.filename} is also in the resolved set ({local.name})",
                              "add a local wheel only for a distribution the requirements do not pull in")
        entries.append(local)
    if not entries:
        raise ConfigError("nothing to put in the wheelhouse", "pass requirements (--sglang VERSION) or --add WHEEL")
    resolve_s = time.monotonic() - t0
    result = BuildResult(out or Path("."), target, list(requirements), entries, dry_run, resolve_s=resolve_s,
                         reused_lock=reuse is not None)
    if dry_run:
        say(f"resolved {len(entries)} wheels in {resolve_s:.1f}s; sizing them")
        _remote_sizes(entries)
        return result
    assert out is not None
    out.mkdir(parents=True, exist_ok=True)
    cache = None  # "present" means hashed now: a file changed in place with its size and mtime kept is caught
    old = {}
    try:
        old = {e.filename: e for e in read_lock(out).entries}
    except ConfigError:
        pass
    missing = []
    for e in entries:
        path = out / e.filename
        if _matches(path, e, cache):
            result.present.append(e.filename)
        elif e.url is None:  # local wheel: copy it in
            tmp = out / f".{e.filename}.part"
            shutil.copyfile(local_files[e.filename], tmp)
            os.replace(tmp, path)
        else:
            missing.append(e)
    t1 = time.monotonic()
    if missing:
        say(f"downloading {len(missing)} of {len(entries)} wheels")
        _download(out, missing, target, index_url)
        result.downloaded = [e.filename for e in missing]
        result.downloaded_bytes = sum((out / e.filename).stat().st_size for e in missing)
    result.download_s = time.monotonic() - t1
    for e in entries:
        e.size = (out / e.filename).stat().st_size
    # wheels the previous lock had and this one does not would shadow the set in --find-links
    keep = {e.filename for e in entries}
    for name in sorted(set(old) - keep):
        if (out / name).is_file():
            (out / name).unlink()
            result.removed.append(name)
    lock = Lock(target, list(requirements), entries, index_url if requirements else None)
    tmp = out / f".{LOCK_NAME}.part"
    tmp.write_text(lock.to_toml())
    os.replace(tmp, out / LOCK_NAME)
    return result


def _save_cache(cache: dict) -> None:
    from opsctl.artifacts import CACHE_DIR

    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        (CACHE_DIR / "sha256-cache.json").write_text(json.dumps(cache))
    except OSError:
        pass


def _download(out: Path, entries: list[Entry], target: Target, index_url: str) -> None:
    """pip download, hash-checked, into a scratch dir beside `out`, then renamed into place."""
    scratch = Path(tempfile.mkdtemp(prefix=".download-", dir=out))
    try:
        reqs = scratch / "requirements.txt"
        reqs.write_text("".join(f"{e.name}=={e.version} --hash=sha256:{e.sha256}\n" for e in entries))
        proc = _pip(["download", "--no-deps", "--require-hashes", "--quiet", "--index-url", index_url,
                     *target.pip_args(), "-d", str(scratch), "-r", str(reqs)])
        if proc.returncode != 0:
            raise HostError(f"downloading {len(entries)} wheel(s) failed: {_pip_error(proc)}",
                            "check the connection to the index and run the build again (present files are kept)")
        for e in entries:
            got = scratch / e.filename
            if not got.is_file() or sha256_file(got) != e.sha256:
                raise HostError(f"pip did not deliver {e.filename} with sha256 {e.sha256[:12]}",
                                "run the build again; if it persists the index changed the file")
            os.replace(got, out / e.filename)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------- verify


@dataclass
class VerifyResult:
    directory: Path
    lock: Lock
    problems: list[dict]          # {file, problem}
    resolver_ok: bool
    resolver_error: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems and self.resolver_ok

    def as_dict(self) -> dict:
        return {"ok": self.ok, "directory": str(self.directory), "python": self.lock.target.python,
                "platform": self.lock.target.platform, "packages": len(self.lock.entries),
                "total_bytes": self.lock.total_bytes, "problems": self.problems,
                "offline_resolution": {"ok": self.resolver_ok, "error": self.resolver_error or None},
                "duration_s": round(self.duration_s, 2)}


def verify(directory: Path) -> VerifyResult:
    """Every file matches the lock; nothing unlocked lies beside it; pip finds the whole set
    in the directory alone for the lock's target. Raises ConfigError for a missing lock."""
    t0 = time.monotonic()
    lock = read_lock(directory)
    problems = []
    for e in lock.entries:
        path = directory / e.filename
        if not path.is_file():
            problems.append({"file": e.filename, "problem": "missing"})
        elif e.size is not None and path.stat().st_size != e.size:
            problems.append({"file": e.filename, "problem": f"size {path.stat().st_size} != locked {e.size}"})
        elif (got := sha256_file(path)) != e.sha256:  # hashed for real: no cache keyed by size and mtime here
            problems.append({"file": e.filename, "problem": f"sha256 {got[:12]}... != locked {e.sha256[:12]}..."})
    locked = {e.filename for e in lock.entries}
    for p in sorted(directory.glob("*.whl")):
        if p.name not in locked:
            problems.append({"file": p.name, "problem": "not in the lock (pip could pick it instead)"})
    ok, error = offline_resolution(directory, lock)
    return VerifyResult(directory, lock, problems, ok, error, time.monotonic() - t0)


def offline_resolution(directory: Path, lock: Lock) -> tuple[bool, str]:
    """pip's resolver, no index, only this directory, for the lock's target: the pinned set
    with its dependencies (no-deps entries alone). Each pick must be the locked file."""
    groups = [([e for e in lock.entries if not e.no_deps], []), ([e for e in lock.entries if e.no_deps], ["--no-deps"])]
    errors = []
    for entries, extra in groups:
        if not entries:
            continue
        with tempfile.TemporaryDirectory(prefix="opsctl-verify-") as tmp:
            report = Path(tmp) / "report.json"
            proc = _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--no-index", "--no-cache-dir",
                         "--find-links", str(directory), *lock.target.pip_args(), *extra, "--report", str(report),
                         *[f"{e.name}=={e.version}" for e in entries]])
            if proc.returncode != 0 or not report.is_file():
                errors.append(_pip_error(proc))
                continue
            data = json.loads(report.read_text())
        locked = {e.filename for e in lock.entries}
        for item in data.get("install", []):
            picked = _url_filename(item["download_info"]["url"])
            if picked not in locked:
                errors.append(f"pip picked {picked}, which is not in the lock")
    return not errors, "; ".join(errors)


# --------------------------------------------------------------------------- the host side (deploy)


@dataclass(frozen=True)
class HostPython:
    python: str              # "3.11"
    arch: str                # "x86_64"
    glibc: str | None        # "2.36"; None on a non-glibc host


def probe_host(conn, host) -> HostPython:
    """The host's Python version, machine and glibc (one command over the connection)."""
    py = ("import os,platform,sys;print('%d.%d'%sys.version_info[:2]);print(platform.machine());"
          "print((os.confstr('CS_GNU_LIBC_VERSION') or '').replace('glibc ',''))")
    res = conn.run(f"{shlex.quote(str(host.host_python))} -c {shlex.quote(py)}", check=False)
    lines = res.stdout.split("\n")
    if not res.ok or len(lines) < 3 or not re.fullmatch(r"3\.\d+", lines[0].strip()):
        raise HostError(f"{host.name}: could not run {host.host_python} to read its Python and glibc version "
                        f"({(res.stderr or res.stdout).strip()[:200]})",
                        "set opsctl.host_python to the host's python3")
    return HostPython(lines[0].strip(), lines[1].strip(), lines[2].strip() or None)


def host_refusal(lock: Lock, facts: HostPython, host_name: str) -> tuple[str, str] | None:
    """(problem, fix) when some wheel cannot install on the host, else None. Pure."""
    glibc = tuple(int(x) for x in facts.glibc.split(".")[:2]) if facts.glibc else None
    plat = f"manylinux_{glibc[0]}_{glibc[1]}_{facts.arch}" if glibc else f"linux_{facts.arch}"
    supported = set(Target(facts.python, plat).tags())
    bad = [e for e in lock.entries if not wheel_tags(e.filename) & supported]
    if not bad:
        return None
    needs_glibc = [(wheel_min_glibc(e.filename), e.filename) for e in bad]
    needs_glibc = [(v, f) for v, f in needs_glibc if v is not None and (glibc is None or v > glibc)]
    target = lock.target
    if needs_glibc:
        need, name = max(needs_glibc)
        have = facts.glibc or "none (not a glibc system)"
        return (f"{host_name} has glibc {have}, but {name} needs glibc >= {need[0]}.{need[1]}"
                + (f" ({len(needs_glibc) - 1} more wheel(s) need a newer glibc than the host's)"
                   if len(needs_glibc) > 1 else "") + "; nothing was shipped",
                f"build the wheelhouse for this host (opsctl wheelhouse build --platform "
                f"manylinux_{glibc[0]}_{glibc[1]}_{facts.arch} --python {facts.python}) or move the host to "
                f"glibc >= {need[0]}.{need[1]}" if glibc else "use a glibc-based host")
    first = bad[0].filename
    return (f"{host_name} runs Python {facts.python} on {facts.arch}, but {first} "
            f"(and {len(bad) - 1} more) is for Python {target.python} on {target.platform}; nothing was shipped",
            f"point opsctl.host_python at a Python {target.python} on the host, or build the wheelhouse with "
            f"--python {facts.python} --platform {plat}")


def remote_base(host) -> PurePosixPath:
    return host.install_root / "shared" / "wheelhouses"


def ship_manifest(directory: Path, lock: Lock) -> DrafterManifest:
    """The files that travel: every locked wheel and the lock itself, by content."""
    cache = _hash_cache()
    files = {e.filename: {"sha256": e.sha256, "size": e.size} for e in lock.entries}
    files[LOCK_NAME] = {"sha256": sha256_file(directory / LOCK_NAME, cache),
                        "size": (directory / LOCK_NAME).stat().st_size}
    return DrafterManifest(files)


def plan_base_env(conn, host) -> dict:
    """Before anything is shipped: the inventory's wheelhouse is complete and matches its lock
    (sizes; hashes through the controller's hash cache), holds the base requirements, and
    every wheel installs on the host's Python and glibc. Returns what shipping would do."""
    directory = Path(host.runtime.wheelhouse)
    lock = read_lock(directory)
    cache = _hash_cache()
    bad = [e.filename for e in lock.entries if not _matches(directory / e.filename, e, cache)]
    _save_cache(cache)
    if bad:
        raise ConfigError(f"wheelhouse {directory} does not match its lock: {', '.join(bad[:3])}"
                          + (f" and {len(bad) - 3} more" if len(bad) > 3 else "") + " missing or changed",
                          f"run 'opsctl wheelhouse verify {directory}' for the list, then "
                          f"'opsctl wheelhouse build --out {directory}' to fetch them again")
    names = {e.name for e in lock.entries}
    for req in host.runtime.base_requirements:
        if canonicalize_name(Requirement(req).name) not in names:
            raise ConfigError(f"wheelhouse {directory} has no {Requirement(req).name} for the base requirement {req}",
                              f"rebuild it: opsctl wheelhouse build --out {directory}")
    facts = probe_host(conn, host)
    refusal = host_refusal(lock, facts, host.name)
    if refusal:
        raise ConfigError(*refusal)
    manifest = ship_manifest(directory, lock)
    base = remote_base(host)
    sync = plan_drafter(conn, host, manifest, base=base)
    return {"directory": str(directory), "remote": str(base / manifest.digest), "digest": manifest.digest,
            "packages": len(lock.entries), "bytes_total": manifest.total_bytes,
            "bytes_to_send": sync["bytes_to_send"], "send": len(sync["send"]), "link": len(sync["link"]),
            "present": sync["present"], "host": {"python": facts.python, "arch": facts.arch, "glibc": facts.glibc}}


def ship(conn, host, progress: Say | None = None) -> tuple[PurePosixPath, SyncResult]:
    """Send the wheelhouse by content into <root>/shared/wheelhouses/<digest>/ (hard links for
    files the host already has, rsync for the rest, checksums before the final rename)."""
    directory = Path(host.runtime.wheelhouse)
    lock = read_lock(directory)
    manifest = ship_manifest(directory, lock)
    base = remote_base(host)
    sync = sync_drafter(conn, host, directory, manifest, progress, base=base, what="wheelhouse")
    return base / manifest.digest, sync
