"""A release's files on the host checked against its manifest (issue #32 item 9): the rendered
files, the runtime tree (`releases/<id>/site/`) and the drafter, by full sha256 unless the
operator asks for speed.

The check itself is `playbooks/files/opsctl-verify` (stdlib Python): the controller sends it
inline (`python3 -c`, as the ledger appender), so it works on a host staged by any version,
and the guard timer runs the copy installed in `<root>/bin`. `site_files()` lists what the
runtime wheel installs, for the manifest, when a release is planned.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from opsctl.config import HostConfig
from opsctl.errors import HostError
from opsctl.host.connection import Connection

VERIFY_PROGRAM = Path(__file__).resolve().parent.parent / "playbooks" / "files" / "opsctl-verify"
DrafterCheck = Literal["full", "sampled", "sizes", "none"]


def site_files(wheel: Path) -> dict[str, str]:
    """{path under site/: sha256} of what `pip install --target site` puts there from `wheel`:
    every file of the wheel but its RECORD (pip writes its own), `<name>.data/purelib|platlib/X`
    as X. Bytecode and the installer's records are not listed (opsctl-verify allows them)."""
    out: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if info.is_dir():
                continue
            parts = name.split("/")
            if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "RECORD":
                continue
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue  # scripts, headers, data: not installed under site/ as is
                name = "/".join(parts[2:])
            out[name] = hashlib.sha256(zf.read(info)).hexdigest()
    return dict(sorted(out.items()))


@dataclass
class Integrity:
    release: str
    problems: list[str] = field(default_factory=list)
    site: dict | None = None
    drafter: dict | None = None
    rendered: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self, most: int = 3) -> str:
        shown = "; ".join(self.problems[:most])
        more = f"; and {len(self.problems) - most} more" if len(self.problems) > most else ""
        return shown + more

    def checked(self) -> str:
        """What was checked, in words: '4 rendered files, 15 runtime files, drafter 3 files (full sha256)'."""
        parts = [f"{self.rendered} rendered file(s)"]
        if self.site is not None:
            parts.append(f"{self.site.get('files', 0)} runtime file(s)"
                         + (" (against the wheel's RECORD)" if self.site.get("how") == "record" else ""))
        if self.drafter:
            how = {"full": "full sha256", "sampled": "sampled sha256"}.get(self.drafter.get("how"), "sizes only")
            parts.append(f"drafter {self.drafter.get('files', 0)} file(s) ({how})")
        return ", ".join(parts)

    def as_dict(self) -> dict:
        return {"release": self.release, "ok": self.ok, "problems": self.problems, "site": self.site,
                "drafter": self.drafter, "rendered": self.rendered}


def parse_report(release: str, stdout: str) -> Integrity | None:
    """opsctl-verify's JSON line (None: it printed none)."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "problems" in data:
            return Integrity(release, list(data.get("problems") or []), data.get("site"), data.get("drafter"),
                             int(data.get("rendered") or 0))
    return None


def verify_command(host: HostConfig, release: str, *, drafter: DrafterCheck = "full", site: bool = True) -> str:
    src = VERIFY_PROGRAM.read_text()
    return (f"{shlex.quote(str(host.host_python))} -c {shlex.quote(src)} {shlex.quote(str(host.install_root))} "
            f"{shlex.quote(release)} --drafter {drafter}" + ("" if site else " --no-site"))


def verify_release(conn: Connection, host: HostConfig, release: str, *, drafter: DrafterCheck = "full",
                   site: bool = True, timeout: float = 3600) -> Integrity:
    """Check `release` on the host (see the module's doc). A check that cannot run is a HostError."""
    res = conn.run(verify_command(host, release, drafter=drafter, site=site), check=False, timeout=timeout)
    report = parse_report(release, res.stdout)
    if report is None:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [f"exit {res.rc}"]
        raise HostError(f"could not check the files of release {release} on {host.name}: {tail[0][:200]}",
                        f"check that {host.host_python} runs on the host")
    return report
