"""The host-side package: what runs on the GPU host without opsctl, with the host's python3 and
its standard library only (Python >= 3.8).

  prometheus.py   the one reader of SGLang's /metrics (labels read one way for every user)
  sglang_rules.py SGLang 0.5.23's capture list, its clamp, the band routing: the one definition
                  (the runtime and the emulator carry generated copies)
  capture.py      a profile's capture list; a budget schedule's undrafted batches
  analysis.py     the analysis spec (the rules a release is held to) and its evaluation
  watch_agent.py  the watch: keeps judging the promoted release (its own systemd unit)
  loadgen.py      the load generator and greedy canary the gate's bench runs on the host
  metrics.py      opsctl's node_exporter textfile (docs/metrics.md), written by the ledger appender and the watch

The controller imports these same modules (the gate judges by analysis.py, the render-time
schedule checks use capture.py, `opsctl bench --url` runs loadgen.py); the host gets them as
one archive, `<root>/bin/opsctl-onhost.pyz` (`archive()`), run as
`python3 opsctl-onhost.pyz {watch|loadgen|metrics} ARGS`. Modules here import each other relatively and
nothing else of opsctl (an import-linter contract in pyproject.toml; the archive is tested
under `python3 -I -S`).
"""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

ARCHIVE_NAME = "opsctl-onhost.pyz"
PACKAGE = "opsctl_onhost"   # the package's name inside the archive
_EPOCH = (1980, 1, 1, 0, 0, 0)
_ENTRY = (f"import sys\nfrom {PACKAGE}.__main__ import main\n\nsys.exit(main())\n").encode()


def archive() -> bytes:
    """This package as a zipapp, byte for byte the same for the same sources (fixed times,
    sorted, stored), so a deploy that changes nothing changes nothing on the host."""
    source = Path(__file__).resolve().parent
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        entries = [("__main__.py", _ENTRY)] + [(f"{PACKAGE}/{p.name}", p.read_bytes())
                                              for p in sorted(source.glob("*.py"))]
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return buf.getvalue()
