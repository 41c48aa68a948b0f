"""Write a Rendered release to a local directory (for `opsctl render --out`)."""
from __future__ import annotations

import os
from pathlib import Path

from opsctl.errors import ConfigError
from opsctl.render import Rendered


def write_rendered(rendered: Rendered, out: Path) -> list[Path]:
    try:
        return _write(rendered, out)
    except OSError as exc:
        raise ConfigError(f"cannot write the rendered files under {out}: {exc.strerror or exc}"
                          + (f" ({exc.filename})" if exc.filename else ""),
                          "pass --out a directory you can write to, e.g. --out /tmp/render") from None


def _write(rendered: Rendered, out: Path) -> list[Path]:
    written = []
    for host_path, text in rendered.files.items():
        target = out / host_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target)
    link = out / rendered.unit_link.lstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(os.path.relpath(out / (str(rendered.install_root / "current" / rendered.unit_name)).lstrip("/"),
                               link.parent), link)
    written.append(link)
    return written
