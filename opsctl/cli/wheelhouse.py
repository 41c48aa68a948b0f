"""opsctl wheelhouse build|verify, opsctl runtime build: the air-gapped host's wheels.

Thin: parse, call opsctl.wheelhouse / opsctl.buildwheel, print.
"""
from __future__ import annotations

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
    import tempfile

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
    out: Path = typer.Option(Path("dist"), "--out", "-o", help="Directory for the wheel (and, with --triton-arch, "
                             "the Triton cache triton-<arch>-<sha12>/)."),
    triton_arch: Optional[str] = typer.Option(None, "--triton-arch", metavar="ARCH", help="Also compile the draft "
                                              "head's Triton kernels for this GPU architecture (sm_120: RTX PRO 6000 "
                                              "Blackwell, sm_90: H100/H200); no GPU needed. The deploy ships the "
                                              "cache to hosts of this architecture before the switch."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PY", help="The Python that compiles (torch and "
                                         "triton, as the host's SGLang environment). Default: this one, if it has "
                                         "both."),
    inventory: Optional[Path] = typer.Option(None, "--inventory", "-i", show_default=False,
                                             help="Compile what every ddtree profile of this inventory needs (its "
                                             "TP, block, capture list; the model's sizes from its config.json on "
                                             "each host, unless --vocab-size and --hidden are given)."),
    limit: Optional[str] = _common.LimitOpt,
    budgets: Optional[str] = typer.Option(None, "--budgets", metavar="B,B,...", help="DDTree budgets, e.g. 8,16 (with "
                                          "-i: each applied to the inventory's ddtree profiles, as 'deploy ddtree "
                                          "--budget B')."),
    schedule: Optional[str] = typer.Option(None, "--schedule", metavar="MIN_BATCH:BUDGET,...",
                                           help="A budget schedule, e.g. 1:16,8:4,32:0 (its bands with a tree)."),
    block: Optional[int] = typer.Option(None, "--block", help="The drafter's block size (without -i; default 8)."),
    vocab_shard: Optional[int] = typer.Option(None, "--vocab-shard", help="Vocabulary rows per TP rank: the model's "
                                              "vocab_size // tp (without -i), e.g. 20480 for Kimi K2.6 at TP8."),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", help="With -i: the model's vocab_size (instead of "
                                             "reading config.json on the host)."),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="The model's hidden size, e.g. 7168 (Kimi K2.6)."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel size (without -i; default 8)."),
    max_bs: Optional[int] = typer.Option(None, "--max-bs", help="--cuda-graph-max-bs-decode: SGLang's capture list "
                                         "(without -i; default 32)."),
    json_out: bool = _common.JsonOpt,
) -> None:
    """Build the sglang-ddtree runtime wheel from runtime/ reproducibly and print its path and sha256;
    with --triton-arch, also fill a Triton cache with the draft head's kernels for that GPU.

    The same bytes for the same sources and build backend (fixed timestamps and permissions,
    only pyproject.toml, README.md and src/**/*.py go in); the deploy ships the same build.
    --triton-arch runs the runtime's filler (python -m sglang_ddtree.aot, with the wheel just
    built) for what a ddtree release needs: with -i, every ddtree profile of the inventory;
    else the budgets or schedule and sizes named here. The cache goes to DIR/triton-<arch>-<sha12>/
    and to opsctl's cache, from which the deploy ships it to a host that lacks it (the
    'triton' step of stage), so the first start compiles nothing. About 30 s of CPU per budget.
    With --json, prints {path, name, sha256, size, source_digest, backend, triton: {arch,
    directory, controller_cache, specialisations, capture_bs, hidden, tp, kernels, seconds, ...}}.

    Examples:

      opsctl runtime build --out dist/

      opsctl runtime build --triton-arch sm_120 -i inventories/blackwell --out dist/

      opsctl runtime build --triton-arch sm_120 -i inventories/lab --budgets 16 --python .venv-sglang/bin/python

      opsctl runtime build --triton-arch sm_120 --budgets 16 --vocab-shard 20480 --hidden 7168 --tp 8 --max-bs 32
    """
    import dataclasses

    from opsctl import triton
    from opsctl.buildwheel import build_runtime_wheel

    _output.set_json(json_out)
    wanted = _triton_wanted(triton_arch, inventory, limit, budgets, schedule, vocab_shard, vocab_size, hidden,
                            {"--block": block, "--tp": tp, "--max-bs": max_bs})
    needs, skipped, compiler = [], [], None
    if wanted:
        # every bad input is found before the build: the runtime's sha is filled in after it
        arch = triton.require_arch(triton_arch)
        budget_list = _budget_list(budgets)
        if inventory is not None:
            needs, skipped = triton.needs_for_inventory(_common.inventory(inventory), limit, arch=arch, runtime="",
                                                        budgets=budget_list, schedule=schedule,
                                                        vocab_size=vocab_size, hidden=hidden)
        else:
            # the built-in ddtree profile's block, TP and capture size by default
            needs = [triton.needs_from(arch=arch, runtime="", budgets=budget_list, schedule=schedule,
                                       block=8 if block is None else block, vocab_shard=vocab_shard or 0,
                                       hidden=hidden or 0, tp=8 if tp is None else tp,
                                       max_bs=32 if max_bs is None else max_bs)]
        triton.fill_groups(needs)
        compiler = triton.check_python(python)
    built = build_runtime_wheel(out)
    result = {"ok": True, **built.as_dict()}
    if wanted:
        if inventory is not None:
            _same_wheel_as_the_deploy(_common.inventory(inventory), limit, built)
        other = _deploy_wheel(built)
        if other is not None:
            result["deploy_wheel_differs"] = str(other)
            _output.info(f"note: the deploy's cached runtime wheel for these sources, {other}, has other bytes "
                         f"than this build: a deploy from this machine ships that one and not this Triton cache "
                         f"(remove {other.parent} to have the deploy take this build)")
        for line in skipped:
            _output.info(f"skipped: {line}")
        needs = [dataclasses.replace(n, runtime=built.sha256) for n in needs]
        cache = triton.build_cache(built.path, built.sha256, needs, out, compiler=compiler, say=_output.info,
                                   skipped=skipped)
        result["triton"] = cache.as_dict()
    if json_out:
        _output.emit_json(result)
        return
    _output.info(f"{built.path}\nsha256 {built.sha256}  ({built.size} bytes; {built.backend})")
    if wanted:
        specs = ", ".join(f"budget {s.budget}/block {s.block}/shard {s.vocab_shard}" for s in cache.specialisations)
        _output.info(f"Triton cache for {cache.arch}: {cache.directory} ({len(cache.specialisations)} "
                     f"specialisation(s): {specs}; {cache.kernels} kernel(s) compiled in {cache.seconds:.0f}s with "
                     f"Triton {cache.triton_version})\nthe deploy ships it from {cache.controller_dir}")


def _triton_wanted(arch, inventory, limit, budgets, schedule, vocab_shard, vocab_size, hidden, shape: dict) -> bool:
    """Whether to compile; options that only mean something with --triton-arch are refused without it,
    and the sizes a compile without an inventory needs are asked for by name."""
    if limit is not None and inventory is None:
        raise ConfigError("--limit given without -i: it selects hosts of an inventory",
                          "add -i INVENTORY, or drop --limit")
    named = [flag for flag, v in (("-i", inventory), ("--budgets", budgets), ("--schedule", schedule),
                                  ("--vocab-shard", vocab_shard), ("--vocab-size", vocab_size),
                                  ("--hidden", hidden), *shape.items()) if v is not None]
    if not arch:
        if named:
            raise ConfigError(f"{', '.join(named)} given without --triton-arch: nothing would use them",
                              "add --triton-arch ARCH (e.g. sm_120) to compile the Triton cache, or drop them")
        return False
    if inventory is not None:
        own = [flag for flag, v in shape.items() if v is not None]
        if own:
            raise ConfigError(f"{', '.join(own)} with -i: each ddtree profile of the inventory has its own",
                              "drop them (or set them in the inventory's opsctl.profiles), or leave out -i")
        if vocab_shard is not None:
            raise ConfigError("--vocab-shard with -i: the shard is the model's vocab_size // each profile's TP",
                              "give --vocab-size (and --hidden) instead, or leave both out to read the host")
        if (vocab_size is None) != (hidden is None):
            raise ConfigError("--vocab-size and --hidden go together with -i (the model's sizes)",
                              "give both, or neither to read the model's config.json on each host")
        return True
    if vocab_size is not None:
        raise ConfigError("--vocab-size needs -i (each profile's TP shards it)",
                          "without an inventory give --vocab-shard (vocab_size // tp)")
    lacking = [flag for flag, v in (("--vocab-shard", vocab_shard), ("--hidden", hidden)) if v is None]
    if budgets is None and schedule is None:
        lacking.insert(0, "--budgets or --schedule")
    if lacking:
        raise ConfigError(f"--triton-arch without an inventory needs {', '.join(lacking)}",
                          "e.g. --budgets 16 --vocab-shard 20480 --hidden 7168 (Kimi K2.6 at TP8), or take them "
                          "from an inventory with -i")
    return True


def _budget_list(text: Optional[str]) -> list[int]:
    if text is None:
        return []
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"--budgets {text!r} is not a list of numbers", "write e.g. --budgets 8,16") from None
    if not out:
        raise ConfigError("--budgets is empty", "write e.g. --budgets 8,16")
    return out


def _deploy_wheel(built) -> Optional[Path]:
    from opsctl.artifacts import CACHE_DIR
    from opsctl.buildwheel import seed_cached_wheel

    return seed_cached_wheel(CACHE_DIR / "wheels", built)


def _same_wheel_as_the_deploy(inv, limit, built) -> None:
    """A host whose inventory names a prebuilt runtime wheel runs that one: a cache made for this
    build would never be shipped to it."""
    from opsctl.artifacts import sha256_file

    for host in inv.select(limit):
        wheel = host.runtime.runtime_wheel
        if wheel is not None and wheel.is_file() and sha256_file(wheel) != built.sha256:
            raise ConfigError(f"{host.name} deploys the runtime wheel {wheel} (opsctl.runtime.runtime_wheel), "
                              f"not this build ({built.sha256[:12]}): its Triton cache would never be shipped",
                              f"point opsctl.runtime.runtime_wheel at {built.path}, or drop it to deploy this build")


def register(app: typer.Typer) -> None:
    app.add_typer(wheelhouse_app)
    app.add_typer(runtime_app)
