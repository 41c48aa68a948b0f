"""opsctl wheelhouse build|verify, opsctl runtime build: the air-gapped host's wheels.

Thin: parse, call opsctl.wheelhouse / opsctl.buildwheel, print.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from opsctl.cli import _common, _output
from opsctl.errors import CheckFailed, ConfigError

wheelhouse_app = typer.Typer(
    name="wheelhouse",
    help=("The wheels the host's base environment is installed from, offline: resolved for the host's "
          "Python and platform, downloaded here, locked in pylock.toml (PEP 751: every file's sha256 and size), "
          "verified, and shipped by content by the deploy.\n\n"
          "Examples:\n\n"
          "  opsctl wheelhouse build -i inventories/blackwell --dry-run\n\n"
          "  opsctl wheelhouse build --sglang 0.5.23 --python 3.11 --platform manylinux_2_34_x86_64 --out wh/\n\n"
          "  opsctl wheelhouse verify wh/"),
    no_args_is_help=True,
    rich_markup_mode=None,
)
runtime_app = typer.Typer(
    name="runtime",
    help=("The sglang-ddtree runtime wheel a ddtree release installs.\n\n"
          "Example:\n\n  opsctl runtime build --out dist/"),
    no_args_is_help=True,
    rich_markup_mode=None,
)


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def _refuse_built_elsewhere(host, directory) -> None:
    """A wheelhouse another command builds (the lab's host runs the SGLang emulator: its
    wheelhouse is `opsctl lab up`'s, the emulator and runtime wheels, nothing resolved) is never
    given the real SGLang set."""
    by = host.runtime.wheelhouse_built_by
    if by:
        raise ConfigError(f"the wheelhouse of {host.name} ({directory}) is built by '{by}' "
                          "(opsctl.runtime.wheelhouse_built_by), not resolved from the real SGLang",
                          f"run '{by}' to rebuild it; for a real SGLang set pass --out DIR (and --sglang V)")


@wheelhouse_app.command("build")
def build_cmd(
    sglang: Optional[str] = typer.Option(None, "--sglang", help="SGLang version: the set is everything "
                                         "sglang==VERSION needs. Default: the inventory's base requirements."),
    python: Optional[str] = typer.Option(None, "--python", help="The host's CPython, MAJOR.MINOR. "
                                         "Default: the inventory's opsctl.runtime.python_version."),
    platform: Optional[str] = typer.Option(None, "--platform", help="The host's platform tag, e.g. "
                                           "manylinux_2_34_x86_64 (glibc >= 2.34). Default: the inventory's "
                                           "opsctl.runtime.platform."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Wheelhouse directory. Default: the "
                                       "inventory's opsctl.runtime.wheelhouse."),
    add: List[Path] = typer.Option([], "--add", help="A local wheel to include as it is, without its "
                                   "dependencies (repeatable)."),
    with_runtime: bool = typer.Option(False, "--with-runtime", help="Build the runtime wheel (opsctl runtime "
                                      "build) and include it without dependencies."),
    index_url: str = typer.Option("https://pypi.org/simple", "--index-url", help="Package index to resolve "
                                  "and download from (pip's own configuration files are not read)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Resolve and print the set and its total size; "
                                 "download nothing, write nothing."),
    refresh: bool = typer.Option(False, "--refresh", help="Resolve again even when DIR's pylock.toml was made "
                                 "for the same target and requirements (default: reuse it, no drift)."),
    inventory: Optional[Path] = _common.InventoryOpt,
    limit: Optional[str] = _common.LimitOpt,
    json_out: bool = _common.JsonOpt,
) -> None:
    """Resolve the complete pinned set of wheels for the host, download what is missing, write pylock.toml.

    A re-run for the same target and requirements reuses DIR's lock (no resolution; --refresh
    resolves again); files already present with the locked sha256 are not downloaded again;
    wheels an earlier lock had and this one does not are removed (pip could otherwise pick them). With --json,
    prints {directory, lock, python, platform, packages, total_bytes, downloaded, downloaded_bytes,
    already_present, wheels: [{name, version, file, sha256, size, url}]}.

    Examples:

      opsctl wheelhouse build -i inventories/blackwell --dry-run

      opsctl wheelhouse build --sglang 0.5.23 --python 3.11 --platform manylinux_2_34_x86_64 --out wh/ --with-runtime
    """
    from opsctl import wheelhouse as wh

    _output.set_json(json_out)
    host = None
    if sglang is None or python is None or platform is None or (out is None and (not dry_run or inventory)):
        host = _common.inventory(inventory).single(limit)
    rt = host.runtime if host else None
    directory = out or (rt.wheelhouse if rt else None)
    if host is not None and out is None:
        _refuse_built_elsewhere(host, directory)  # before anything is resolved
    requirements = [f"sglang=={sglang}"] if sglang else list(rt.base_requirements)
    target = wh.Target(python or rt.python_version, platform or rt.platform)
    wheels = list(add)
    with tempfile.TemporaryDirectory(prefix="opsctl-runtime-") as tmp:
        if with_runtime:
            from opsctl.buildwheel import build_runtime_wheel

            wheels.append(build_runtime_wheel(Path(tmp)).path)
        res = wh.build(directory, requirements, target, add=wheels, index_url=index_url, dry_run=dry_run,
                       refresh=refresh, say=_output.info)
    if json_out:
        _output.emit_json({"ok": True, **res.as_dict()})
        return
    rows = [[e.name, e.version, e.filename, _mib(e.size)] for e in sorted(res.entries, key=lambda e: -(e.size or 0))]
    _output.table(f"{len(res.entries)} wheels for Python {target.python} / {target.platform}",
                  ["package", "version", "file", "size"], rows)
    unknown = sum(1 for e in res.entries if e.size is None)
    _output.info(f"total {_mib(res.total_bytes)} in {len(res.entries)} wheels"
                 + (f" ({unknown} of unknown size)" if unknown else "")
                 + ("; from the existing lock" if res.reused_lock else f"; resolved in {res.resolve_s:.1f}s"))
    if dry_run:
        _output.info(f"dry run: would write {res.directory / wh.LOCK_NAME} and {len(res.entries)} wheel(s) into "
                     f"{res.directory}; nothing was downloaded or written" if directory is not None else
                     "dry run: no directory named (pass --out DIR, or -i INVENTORY for its opsctl.runtime.wheelhouse); "
                     "nothing was downloaded or written")
    else:
        _output.info(f"downloaded {len(res.downloaded)} file(s), {_mib(res.downloaded_bytes)} in {res.download_s:.1f}s; "
                     f"{len(res.present)} already present" + (f"; removed {len(res.removed)} unlocked" if res.removed
                                                               else ""))
        _output.info(f"lock: {res.directory / wh.LOCK_NAME}")


@wheelhouse_app.command("verify")
def verify_cmd(
    directory: Path = typer.Argument(..., help="The wheelhouse directory (holding pylock.toml)."),
    json_out: bool = _common.JsonOpt,
) -> None:
    """Check a wheelhouse against its pylock.toml and that it installs offline for its target.

    Every locked file must be present with its size and sha256, no unlocked wheel may lie beside
    them, and pip's resolver, with no index and only this directory, must find the whole set for
    the lock's Python and platform. Exit 0 when all holds, 6 with the list of missing or
    mismatched files, 2 when there is no lock. With --json, prints {ok, problems: [{file, problem}],
    offline_resolution: {ok, error}, packages, total_bytes}.

    Example: opsctl wheelhouse verify artifacts/wheelhouse/sglang-0.5.23
    """
    from opsctl import wheelhouse as wh

    _output.set_json(json_out)
    res = wh.verify(directory)
    if json_out:
        _output.emit_json(res.as_dict())
    else:
        for p in res.problems:
            _output.info(f"FAIL {p['file']}: {p['problem']}")
        _output.info(f"offline resolution (--no-index, Python {res.lock.target.python} / {res.lock.target.platform}): "
                     + ("ok" if res.resolver_ok else f"FAIL: {res.resolver_error}"))
        _output.info(f"{len(res.lock.entries)} locked wheels, {_mib(res.lock.total_bytes)}; "
                     f"{len(res.problems)} problem(s) in {res.duration_s:.1f}s")
    if not res.ok:
        if json_out:
            _output.set_json(False)  # stdout already holds the result
        files = ", ".join(f"{p['file']} ({p['problem']})" for p in res.problems[:5])
        raise CheckFailed(f"wheelhouse {directory} failed verification: "
                          + (files + (f" and {len(res.problems) - 5} more" if len(res.problems) > 5 else "")
                             if res.problems else f"offline resolution: {res.resolver_error}"),
                          f"run 'opsctl wheelhouse build --out {directory}' to fetch missing or changed files again",
                          details=res.as_dict())


@runtime_app.command("build")
def runtime_build_cmd(
    out: Path = typer.Option(Path("dist"), "--out", "-o", help="Directory for the wheel."),
    json_out: bool = _common.JsonOpt,
) -> None:
    """Build the sglang-ddtree runtime wheel from runtime/ reproducibly and print its path and sha256.

    The same bytes for the same sources and build backend (fixed timestamps and permissions,
    only pyproject.toml, README.md and src/**/*.py go in); the deploy ships the same build.
    With --json, prints {path, name, sha256, size, source_digest, backend}.

    Example: opsctl runtime build --out dist/
    """
    from opsctl.buildwheel import build_runtime_wheel

    _output.set_json(json_out)
    built = build_runtime_wheel(out)
    if json_out:
        _output.emit_json({"ok": True, **built.as_dict()})
    else:
        _output.info(f"{built.path}\nsha256 {built.sha256}  ({built.size} bytes; {built.backend})")


def register(app: typer.Typer) -> None:
    app.add_typer(wheelhouse_app)
    app.add_typer(runtime_app)
