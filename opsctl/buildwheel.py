"""The reproducible runtime wheel (`sglang-ddtree`, from runtime/): one implementation
behind `opsctl runtime build`, `scripts/build-runtime-wheel` and the deploy's runtime wheel.

Reproducible: only what goes into the wheel is copied (pyproject.toml, README.md,
src/**/*.py) into a scratch directory with normalised permissions and timestamps,
and built with a fixed SOURCE_DATE_EPOCH (zip timestamps), so the same sources and
the same build backend give the same bytes. The build backend is the interpreter's
setuptools + wheel when both import (no network), else pip fetches it (build
isolation, needs the index). Stdlib only: the script runs it with any Python
(`python -m opsctl.buildwheel OUT`).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opsctl.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO_ROOT / "runtime"
DEFAULT_EPOCH = 315532800  # 1980-01-01, the earliest zip timestamp


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    sha256: str
    size: int
    source_digest: str
    backend: str

    def as_dict(self) -> dict:
        return {"path": str(self.path), "name": self.path.name, "sha256": self.sha256, "size": self.size,
                "source_digest": self.source_digest, "backend": self.backend}


def wheel_inputs(source: Path) -> list[Path]:
    """What goes into the wheel, relative to `source`, sorted."""
    files = [Path("pyproject.toml"), Path("README.md")]
    files += sorted(p.relative_to(source) for p in (source / "src").rglob("*.py") if "__pycache__" not in p.parts)
    return files


def source_digest(source: Path = DEFAULT_SOURCE) -> str:
    h = hashlib.sha256()
    for rel in wheel_inputs(source):
        h.update(rel.as_posix().encode() + b"\0" + (source / rel).read_bytes() + b"\0")
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _backend(python: str) -> tuple[bool, str]:
    """(build offline with this interpreter's setuptools + wheel?, description)."""
    proc = subprocess.run([python, "-c", "import setuptools, wheel; print(setuptools.__version__, wheel.__version__)"],
                          capture_output=True, text=True)
    if proc.returncode == 0:
        st, wh = proc.stdout.split()
        return True, f"setuptools {st}, wheel {wh} ({python})"
    return False, "setuptools + wheel fetched by pip (build isolation)"


def build_runtime_wheel(out: Path, source: Path = DEFAULT_SOURCE, *, python: str | None = None) -> BuiltWheel:
    """Build the runtime wheel into `out` (created); returns its path and sha256."""
    python = python or sys.executable
    if not (source / "pyproject.toml").is_file() or not (source / "src").is_dir():
        raise ConfigError(f"no runtime source at {source} (pyproject.toml and src/ expected)",
                          "run from an opsctl checkout, or pass the runtime directory")
    missing = [str(rel) for rel in wheel_inputs(source) if not (source / rel).is_file()]
    if missing:
        raise ConfigError(f"runtime source {source} lacks {', '.join(missing)}", "restore the file from git")
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or DEFAULT_EPOCH)
    offline, backend = _backend(python)
    with tempfile.TemporaryDirectory(prefix="opsctl-runtime-") as tmp:
        src = Path(tmp) / "src"
        for rel in wheel_inputs(source):
            dst = src / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / rel, dst)
            os.chmod(dst, 0o644)
        for p in sorted(src.rglob("*"), reverse=True):
            if p.is_dir():
                os.chmod(p, 0o755)
            os.utime(p, (epoch, epoch))
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "PYTHONHASHSEED": "0",
               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        cmd = [python, "-m", "pip", "wheel", "--no-deps", *(["--no-build-isolation"] if offline else []),
               "--quiet", "-w", str(Path(tmp) / "out"), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wheels = sorted((Path(tmp) / "out").glob("sglang_ddtree-*.whl"))
        if proc.returncode != 0 or not wheels:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise ConfigError(f"building the runtime wheel from {source} failed: {' | '.join(tail)}",
                              "install setuptools and wheel into the Python that builds it, or allow pip to "
                              "reach the package index for them")
        out.mkdir(parents=True, exist_ok=True)
        final = out / wheels[0].name
        tmp_final = out / f".{wheels[0].name}.tmp"
        shutil.copyfile(wheels[0], tmp_final)
        os.replace(tmp_final, final)
    return BuiltWheel(final, _sha256(final), final.stat().st_size, source_digest(source), backend)


def cached_runtime_wheel(cache_root: Path, source: Path = DEFAULT_SOURCE) -> Path:
    """The runtime wheel for these sources, built once into <cache_root>/<source digest>/."""
    out = cache_root / source_digest(source)[:16]
    existing = sorted(out.glob("*.whl"))
    if existing:
        return existing[0]
    return build_runtime_wheel(out, source).path


def seed_cached_wheel(cache_root: Path, built: BuiltWheel, source: Path = DEFAULT_SOURCE) -> Path | None:
    """Make `built` the wheel the deploy takes for these sources (`cached_runtime_wheel`) when it
    has none yet, so what was compiled for this build's sha is what ships. Returns the cached
    wheel when one with other bytes is already there (another build backend), else None."""
    out = cache_root / built.source_digest[:16]
    existing = sorted(out.glob("*.whl"))
    if existing:
        return None if _sha256(existing[0]) == built.sha256 else existing[0]
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{built.path.name}.tmp"
    shutil.copyfile(built.path, tmp)
    os.replace(tmp, out / built.path.name)
    return None


def main(argv: list[str]) -> int:
    """`python -m opsctl.buildwheel [OUT_DIR]`: print the wheel's path (scripts/build-runtime-wheel)."""
    out = Path(argv[0]) if argv else REPO_ROOT / "dist"
    try:
        built = build_runtime_wheel(out)
    except ConfigError as exc:
        print(f"build-runtime-wheel: ERROR: {exc.one_line()}", file=sys.stderr)
        return 1
    print(built.path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
