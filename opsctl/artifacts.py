"""What a release ships besides rendered text: the runtime wheel and the drafter weights.

Drafter weights move by content: a sha256 manifest is compared with what the host
already has (any earlier drafter directory), matching files are hard-linked there,
only missing or different files are sent (rsync over SSH, resumable: partial data
survives an interruption), everything lands in a temporary directory that is
renamed into `shared/drafters/<digest>` only after every checksum verifies.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from opsctl.brake import die_with_parent
from opsctl.config import HostConfig
from opsctl.errors import ConfigError, HostError
from opsctl.host.connection import Connection

REPO_ROOT = Path(__file__).resolve().parent.parent
# AES-GCM first (hardware AES on both ends is the common case); the server picks what it supports
FAST_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr"
CACHE_DIR = Path(os.environ.get("OPSCTL_CACHE_DIR", Path.home() / ".cache" / "opsctl"))


# --------------------------------------------------------------------------- hashing


def _hash_cache() -> dict:
    try:
        return json.loads((CACHE_DIR / "sha256-cache.json").read_text())
    except (OSError, ValueError):
        return {}


def sha256_file(path: Path, cache: dict | None = None) -> str:
    st = path.stat()
    key = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    if cache is not None and key in cache:
        return cache[key]
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    digest = h.hexdigest()
    if cache is not None:
        cache[key] = digest
    return digest


@dataclass(frozen=True)
class DrafterManifest:
    files: dict[str, dict]  # relative path -> {"sha256", "size"}

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.files, sort_keys=True).encode()).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files.values())

    def to_json(self, sampled: dict[str, str] | None = None) -> str:
        """The host's manifest.json; `sampled` (rel -> sampled_sha256) lets a quick check compare samples
        (playbooks/files/opsctl-verify --drafter sampled). It is outside `files`: the digest ignores it."""
        return json.dumps({"digest": self.digest, "files": self.files, **({"sampled": sampled} if sampled else {})},
                          indent=1, sort_keys=True) + "\n"


def drafter_manifest(source: Path) -> DrafterManifest:
    if not source.is_dir():
        raise ConfigError(f"drafter weights directory {source} does not exist",
                          "set opsctl.drafter.source in the inventory to the directory holding "
                          "config.json and *.safetensors" +
                          ("; for the lab run 'opsctl lab up'" if "opsctl-lab" in str(source) else ""))
    files = sorted(p for p in source.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not any(p.suffix == ".safetensors" for p in files) or not (source / "config.json").is_file():
        raise ConfigError(f"drafter directory {source} has no config.json or no *.safetensors file",
                          "point opsctl.drafter.source at a complete DFlash drafter checkout")
    cache = _hash_cache()
    out = {str(p.relative_to(source)): {"sha256": sha256_file(p, cache), "size": p.stat().st_size} for p in files}
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        (CACHE_DIR / "sha256-cache.json").write_text(json.dumps(cache))
    except OSError:
        pass
    return DrafterManifest(out)


# --------------------------------------------------------------------------- runtime wheel


def runtime_wheel(host: HostConfig) -> Path:
    """The runtime wheel a ddtree release installs: the inventory's prebuilt one, or
    built from runtime/ (cached by source digest, reproducible timestamps)."""
    if host.runtime.runtime_wheel:
        wheel = host.runtime.runtime_wheel
        if not wheel.is_file():
            raise ConfigError(f"runtime wheel {wheel} does not exist",
                              "build it with scripts/build-runtime-wheel or drop opsctl.runtime.runtime_wheel")
        return wheel
    source = host.runtime.runtime_source or REPO_ROOT / "runtime"
    if not (source / "pyproject.toml").is_file():
        raise ConfigError(f"no runtime source at {source}", "set opsctl.runtime.runtime_wheel to a built wheel")
    # the same reproducible build as `opsctl runtime build`, cached by source digest
    from opsctl.buildwheel import cached_runtime_wheel

    return cached_runtime_wheel(CACHE_DIR / "wheels", source)


# --------------------------------------------------------------------------- drafter sync


@dataclass
class SyncResult:
    digest: str
    bytes_total: int
    bytes_sent: int
    files_sent: int
    files_linked: int
    already_present: bool
    duration_s: float
    verify_s: float = 0.0

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def remote_drafter_state(conn: Connection, host: HostConfig, base: PurePosixPath | None = None
                         ) -> tuple[set[str], dict[str, str]]:
    """(complete drafter digests on the host, sha256 -> path of a verified file there).
    `base`: another content-addressed tree of the same layout (the wheelhouses)."""
    base = base or host.install_root / "shared" / "drafters"
    res = conn.run(f"for m in {base}/*/manifest.json; do [ -f \"$m\" ] && echo \"$m\" && cat \"$m\"; done; true",
                   check=False)
    digests: set[str] = set()
    by_sha: dict[str, str] = {}
    text = res.stdout
    for match in re.finditer(r"^(/\S+/manifest\.json)\n(\{.*?\n\})\n?", text, flags=re.S | re.M):
        path, body = match.group(1), match.group(2)
        try:
            data = json.loads(body)
        except ValueError:
            continue
        d = Path(path).parent
        digests.add(d.name)
        for rel, meta in data.get("files", {}).items():
            by_sha.setdefault(meta["sha256"], str(d / rel))
    return digests, by_sha


SAMPLE = 1 << 20  # bytes per sample: start, middle and end of each file


def _sample_offsets(size: int) -> list[int]:
    return sorted({0, max(0, size // 2 - SAMPLE // 2), max(0, size - SAMPLE)})


def sampled_sha256(path: Path) -> str:
    """sha256 over three 1 MiB samples of a file (start, middle, end) and its size: a cheap
    content check that catches truncation and most corruption without reading GBs."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        for off in _sample_offsets(size):
            f.seek(off)
            h.update(f.read(SAMPLE))
    return h.hexdigest()


# the same function on the host (stdlib python): prints "<rel>\t<sampled sha256>" or "<rel>\tMISSING"
_REMOTE_SAMPLE = f"""
import hashlib, os, sys
base = sys.argv[1]
for rel in sys.stdin.read().split("\\0"):
    if not rel:
        continue
    p = os.path.join(base, rel)
    try:
        size = os.path.getsize(p)
        h = hashlib.sha256(str(size).encode())
        with open(p, "rb") as f:
            for off in sorted({{0, max(0, size // 2 - {SAMPLE} // 2), max(0, size - {SAMPLE})}}):
                f.seek(off)
                h.update(f.read({SAMPLE}))
        print(rel + "\\t" + h.hexdigest())
    except OSError:
        print(rel + "\\tMISSING")
"""


def verify_drafter_on_host(conn: Connection, host: HostConfig, source: Path, manifest: DrafterManifest, *,
                           full: bool = False, base: PurePosixPath | None = None) -> list[str]:
    """Files of the host's copy of `manifest` whose content does not match: missing, another
    size, other sampled bytes, or (full=True) another sha256 of the whole file."""
    final = (base or host.install_root / "shared" / "drafters") / manifest.digest
    rels = sorted(manifest.files)
    if full:
        sums = "".join(f"{manifest.files[r]['sha256']}  {r}\n" for r in rels)
        res = conn.run(f"cd {shlex.quote(str(final))} && sha256sum -c - 2>/dev/null | grep -v ': OK$' | "
                       f"sed 's/: FAILED.*$//'; true", stdin=sums, check=False, timeout=3600)
        return sorted({line.strip() for line in res.stdout.splitlines() if line.strip()} & set(rels))
    res = conn.run(f"{host.host_python} -c {shlex.quote(_REMOTE_SAMPLE)} {shlex.quote(str(final))}",
                   stdin="\0".join(rels), check=False, timeout=600)
    remote = dict(line.split("\t", 1) for line in res.stdout.splitlines() if "\t" in line)
    return [r for r in rels if remote.get(r) != sampled_sha256(source / r)]


def plan_drafter(conn: Connection, host: HostConfig, manifest: DrafterManifest,
                 state: tuple[set[str], dict[str, str]] | None = None, base: PurePosixPath | None = None, *,
                 source: Path | None = None, full_verify: bool = False) -> dict:
    """What a sync would do, without doing it. A tree already on the host is checked by
    content (sizes and sampled hashes; every byte with full_verify): files that differ are
    re-sent ("repair")."""
    digests, by_sha = state or remote_drafter_state(conn, host, base)
    if manifest.digest in digests:
        bad = verify_drafter_on_host(conn, host, source, manifest, full=full_verify, base=base) if source else []
        if bad:
            return {"present": False, "repair": bad, "send": bad, "link": [],
                    "bytes_to_send": sum(manifest.files[r]["size"] for r in bad)}
        return {"present": True, "send": [], "link": [], "bytes_to_send": 0}
    send = [r for r, m in manifest.files.items() if m["sha256"] not in by_sha]
    link = [r for r, m in manifest.files.items() if m["sha256"] in by_sha]
    return {"present": False, "send": send, "link": link,
            "bytes_to_send": sum(manifest.files[r]["size"] for r in send)}


def ssh_command(host: HostConfig) -> list[str]:
    """`ssh` with the host's options (opsctl/host/ssh.py), without the destination."""
    return host.ssh.ssh_argv()


def _rsync(host: HostConfig, source: Path, rels: list[str], dest: Path) -> int:
    """Send `rels` (relative to source) into `dest` on the host; returns bytes sent."""
    with tempfile.NamedTemporaryFile("w", suffix=".list") as flist:
        flist.write("\n".join(rels) + "\n")
        flist.flush()
        limit = host.settings.transfer_limit_mib_s
        # --inplace into our own temp dir + --append-verify: a resumed file sends only its missing tail,
        # then the whole file's checksum is compared (and resent on mismatch)
        cmd = ["rsync", "-a", "--inplace", "--append-verify", "--stats", "--files-from", flist.name,
               *([f"--bwlimit={max(1, int(limit * 1024))}"] if limit else []),
               "-e", host.ssh.rsync_rsh("-o", f"Ciphers={FAST_CIPHERS}"),
               f"{source}/", host.ssh.rsync_remote(f"{dest}/")]
        # its own session: a terminal's ^C goes to opsctl alone, which stops it (brake)
        proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=die_with_parent,
                              start_new_session=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        raise HostError(f"drafter transfer to {host.name} failed (rsync exit {proc.returncode}): {tail}",
                        "check disk space and that rsync is installed on the host; the next deploy resumes")
    m = re.search(r"Total bytes sent: ([\d,]+)", proc.stdout)
    return int(m.group(1).replace(",", "")) if m else 0


def _repair_drafter(conn: Connection, host: HostConfig, source: Path, manifest: DrafterManifest, bad: list[str],
                    progress: Callable[[str], None] | None, t0: float,
                    base: PurePosixPath | None = None) -> SyncResult:
    """Re-send the files of a drafter on the host whose content is wrong, into a side directory,
    verify them, then rename each over the bad one (the drafter directory stays in place)."""
    base = base or host.install_root / "shared" / "drafters"
    final = base / manifest.digest
    repair = base / f".repair-{manifest.digest}"
    if progress:
        progress(f"drafter {manifest.digest[:12]} on the host differs from the source in {len(bad)} file(s) "
                 f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): re-sending them")
    conn.run(f"rm -rf {shlex.quote(str(repair))} && mkdir -p {shlex.quote(str(repair))}")
    sent = _rsync(host, source, bad, repair)
    sums = "".join(f"{manifest.files[r]['sha256']}  {r}\n" for r in bad)
    check = conn.run(f"cd {shlex.quote(str(repair))} && sha256sum --quiet -c -", stdin=sums, check=False)
    if not check.ok:
        raise HostError(f"drafter repair on {host.name}: the re-sent files do not verify: "
                        f"{(check.stdout + check.stderr).strip().splitlines()[:2]}",
                        "check the source weights and the host's disk, then deploy again")
    moves = " && ".join(f"mkdir -p {shlex.quote(str((final / r).parent))} && "
                        f"mv -f {shlex.quote(str(repair / r))} {shlex.quote(str(final / r))}" for r in bad)
    conn.run(f"{moves} && rm -rf {shlex.quote(str(repair))}")
    return SyncResult(manifest.digest, manifest.total_bytes, sent, len(bad), 0, False, time.monotonic() - t0)


def sync_drafter(conn: Connection, host: HostConfig, source: Path, manifest: DrafterManifest,
                 progress: Callable[[str], None] | None = None, *, base: PurePosixPath | None = None,
                 what: str = "drafter", full_verify: bool = False) -> SyncResult:
    """Content sync of `manifest`'s files from `source` to `<base>/<digest>` (default: the
    drafters); `what` names the tree in messages (the wheelhouse uses the same sync)."""
    t0 = time.monotonic()
    base = base or host.install_root / "shared" / "drafters"
    final = base / manifest.digest
    incoming = base / f".incoming-{manifest.digest}"
    state = remote_drafter_state(conn, host, base)
    by_sha = state[1]
    plan = plan_drafter(conn, host, manifest, state, base, source=source, full_verify=full_verify)
    if plan["present"]:
        return SyncResult(manifest.digest, manifest.total_bytes, 0, 0, 0, True, time.monotonic() - t0)
    if plan.get("repair"):
        return _repair_drafter(conn, host, source, manifest, plan["repair"], progress, t0, base)
    conn.run(f"mkdir -p {shlex.quote(str(incoming))}")
    links = []
    for rel in plan["link"]:
        src = by_sha[manifest.files[rel]["sha256"]]
        dst = incoming / rel
        links.append(f"mkdir -p {shlex.quote(str(dst.parent))} && ln -f {shlex.quote(src)} {shlex.quote(str(dst))}")
    if links:
        conn.run(" && ".join(links))
    bytes_sent = 0
    if plan["send"]:
        if progress:
            progress(f"sending {len(plan['send'])} {what} file(s), {plan['bytes_to_send'] / 2**20:.1f} MiB")
        bytes_sent = _rsync(host, source, plan["send"], incoming)
    # verify every checksum before the directory gets its final name
    sums = "".join(f"{meta['sha256']}  {rel}\n" for rel, meta in manifest.files.items())
    t_verify = time.monotonic()
    # one sha256sum per file, as many at once as the host has cores (shards of a drafter hash in parallel)
    check = conn.run(f"cd {shlex.quote(str(incoming))} && xargs -d '\\n' -P \"$(nproc)\" -I@ "
                     f"sh -c 'printf \"%s\\n\" \"$1\" | sha256sum --quiet -c -' _ @", stdin=sums, check=False)
    verify_s = time.monotonic() - t_verify
    if not check.ok:
        bad = (check.stdout + check.stderr).strip().splitlines()[:3]
        conn.run(f"cd {shlex.quote(str(incoming))} && sha256sum -c - 2>/dev/null | grep -v ': OK$' | cut -d: -f1 | xargs -r rm -f --",
                 stdin=sums, check=False)
        raise HostError(f"{what} checksum mismatch on {host.name}: {'; '.join(bad)}",
                        "the bad files were removed; run the deploy again to resend them")
    sampled = {rel: sampled_sha256(source / rel) for rel in manifest.files}
    conn.run(f"cat > {shlex.quote(str(incoming / 'manifest.json'))} "
             f"&& mv -T {shlex.quote(str(incoming))} {shlex.quote(str(final))}", stdin=manifest.to_json(sampled))
    return SyncResult(manifest.digest, manifest.total_bytes, bytes_sent, len(plan["send"]), len(plan["link"]),
                      False, time.monotonic() - t0, verify_s)
