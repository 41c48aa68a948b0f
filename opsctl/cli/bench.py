"""opsctl bench / bench compare / bench import / report."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from opsctl.cli import _common, _output
from opsctl.errors import CheckFailed, ConfigError, HostError

CONCURRENCY_HELP = "Comma-separated concurrency levels, e.g. 1,2,4,8,16,32,64,128 (default: the gate policy's)."


def _levels(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        levels = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"--concurrency must be comma-separated integers, got {text!r}", "e.g. --concurrency 1,4,16")
    if not levels or any(c < 1 for c in levels):
        raise ConfigError(f"--concurrency levels must be positive, got {text!r}", "e.g. --concurrency 1,4,16")
    return levels


def report_name(name: Optional[str], run_file: str) -> str:
    """`report`'s file name stem, as its --help says: --name, else the RELEASE id for a
    release, else 'report' for a results file."""
    if name:
        return name
    return "report" if Path(run_file).is_file() else run_file


class _LevelProgress:
    """A rich progress bar per level (on stderr), fed by loadgen's ProgressEvents."""

    def __init__(self, repeats: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.repeats = repeats
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=_output.err_console, transient=False)
        self.tasks: dict[tuple[str, int, int], Any] = {}

    def __enter__(self) -> "_LevelProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def _rep(self, ev: Any) -> str:
        return f"repeat {ev.repeat + 1}/{self.repeats}" if self.repeats > 0 else f"round {ev.repeat + 1}"

    def __call__(self, ev: Any) -> None:
        kind = ev.kind
        if kind in ("warmup_start", "level_start", "canary_start"):
            label = {"warmup_start": f"warm-up C={ev.concurrency}", "canary_start": "greedy canary"}.get(
                kind, f"C={ev.concurrency:<4} {self._rep(ev)}")
            self.tasks[(kind.split("_")[0], ev.concurrency, ev.repeat)] = self.progress.add_task(label, total=ev.total)
            return
        key = ("canary" if kind.startswith("canary") else "level", ev.concurrency, ev.repeat)
        if kind in ("warmup_end",):
            key = ("warmup", ev.concurrency, ev.repeat)
        task = self.tasks.get(key)
        if task is None:
            return
        now = next(t for t in self.progress.tasks if t.id == task)
        # counts only go forward (events of concurrent requests may arrive out of order), and a
        # finished level or canary shows N/N
        done = (now.total or ev.done) if kind.endswith("_end") else max(ev.done, now.completed)
        self.progress.update(task, completed=max(done, now.completed))
        if kind == "level_end" and ev.record is not None:
            r = ev.record
            self.progress.update(task, description=(
                f"C={ev.concurrency:<4} {self._rep(ev)}  {r['output_throughput']:.1f} tok/s"
                f"  ITL p50 {r['median_itl_ms']:.2f} ms" + (f"  errors {r['errors']}" if r["errors"] else "")))


def _cell(lv: Any, name: str, fmt: str) -> str:
    """A level's field for a table: 'missing' when the (imported) result lacks it, never 0."""
    v = lv.value(name)
    return "missing" if v is None else fmt % v


def _print_run(run: Any, title: str) -> None:
    from opsctl.report import level_label

    med = run.median()
    rows = [[level_label(lv), _cell(lv, "output_throughput", "%.1f"), _cell(lv, "request_throughput", "%.2f"),
             _cell(lv, "median_ttft_ms", "%.1f"), _cell(lv, "median_itl_ms", "%.2f"), _cell(lv, "p99_itl_ms", "%.2f"),
             _cell(lv, "median_e2e_latency_ms", "%.0f"), "-" if lv.accept is None else f"{lv.accept:.2f}",
             _cell(lv, "errors", "%d")] for lv in med.levels]
    _output.table(title + f" (median of {run.repeats} repeat(s); ms)",
                  ["C", "tok/s", "req/s", "TTFT p50", "ITL p50", "ITL p99", "E2E p50", "accept", "errors"], rows)
    c = run.canary
    if c is not None:
        if c.error:
            _output.info(f"canary: error: {c.error}")
        elif c.mismatch:
            m = c.mismatch
            _output.info(f"canary: MISMATCH at prompt {m['prompt']}, token {m['position']} "
                         f"(expected {m.get('expected')}, got {m.get('got')})")
        else:
            _output.info(f"canary: {len(c.prompts)} prompts decoded" + (", identical" if c.compared else ""))


def _emit_run(run: Any) -> None:
    _output.emit_json({"record": "meta", **run.meta})
    for lv in run.levels:
        _output.emit_json(lv.record())
    if run.canary is not None:
        _output.emit_json(run.canary.record())


def _bench_url(url: str, *, concurrency: Optional[list[int]], input_len: Optional[int], output_len: Optional[int],
               requests_per_level: Optional[int], repeats: Optional[int], warmup: Optional[int], seed: Optional[int],
               prompt_file: Optional[Path], canary_prompts: int, canary_file: Optional[Path],
               request_timeout: float, progress: Optional[Callable[[Any], None]], workload: Optional[str] = None):
    import tempfile

    from opsctl.onhost import loadgen
    from opsctl.gate.results import from_records
    from opsctl.gate.workloads import WorkloadSet, mix_key, parse_mix
    from opsctl.gate.decide import GatePolicy

    pol = GatePolicy()
    mix = parse_mix(workload) if workload else None
    requests_file = None
    if mix is not None:
        if prompt_file is not None:
            raise ConfigError("--workload and --prompt-file exclude each other", "use --workload file:PATH")
        ws = WorkloadSet.load(mix, input_len=input_len or pol.input_len)
        levels = concurrency or pol.concurrency
        n_rep = repeats or pol.repeats
        lines = []
        for c in levels:
            for r in range(n_rep):
                n = max(c, requests_per_level or pol.requests_per_level)
                for req in ws.select(n, seed=pol.seed if seed is None else seed, level=c, repeat=r):
                    lines.append(json.dumps({"level": c, "repeat": r, **req.payload(output_len or pol.output_len)}))
        tmp = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        tmp.write("\n".join(lines) + "\n")
        tmp.close()
        requests_file = tmp.name
    spec = loadgen.LoadSpec(
        url=url, concurrency=concurrency or pol.concurrency, input_len=input_len or pol.input_len,
        output_len=output_len or pol.output_len, requests_per_level=requests_per_level or pol.requests_per_level,
        repeats=repeats or pol.repeats, warmup=pol.warmup if warmup is None else warmup,
        seed=pol.seed if seed is None else seed, prompt_file=str(prompt_file) if prompt_file else None,
        canary_prompts=canary_prompts, canary_file=str(canary_file) if canary_file else None,
        canary_output_len=pol.canary_output_len, request_timeout_s=request_timeout, requests_file=requests_file)
    try:
        spec.validate()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for label, p in (("prompt file", prompt_file), ("canary file", canary_file)):
        if p is not None and not p.is_file():
            raise ConfigError(f"{label} not found: {p}")
    try:
        loadgen.asyncio.run(loadgen.http_request(url, "GET", "/server_info", None, 10.0))
    except (OSError, loadgen.asyncio.TimeoutError, loadgen._HTTPError) as e:
        raise HostError(f"cannot reach the server at {url}: {e}",
                        "is it running? for a remote host open a tunnel: ssh -L 30000:127.0.0.1:30000 HOST") from None
    try:
        records = loadgen.run(spec, progress)
    finally:
        if requests_file:
            Path(requests_file).unlink(missing_ok=True)
    return from_records(records, {"url": url, "created_at": time.time(), "label": url, "concurrency": spec.concurrency,
                                  "input_len": spec.input_len, "output_len": spec.output_len,
                                  "repeats": spec.repeats, "seed": spec.seed,
                                  "workload_mix": mix_key(mix) if mix else "random token ids"})


def _report_diagnosis(run, base, run_file: str, inventory, limit) -> dict | None:
    """The report's "Why" (opsctl diagnose) for a DDTree run with a baseline; None otherwise, or
    when the files cannot say (the report is still written)."""
    from opsctl import diagnose as dx

    if base is None or (str(run.meta.get("kind") or run.meta.get("profile_kind") or "") != "ddtree"
                        and dx.budget_from_meta(run.meta) is None):
        return None
    try:
        if Path(run_file).is_file():
            from opsctl.cli.diagnose import _inventory_reference

            return dx.from_runs(run, base, reference=_inventory_reference(inventory), source={"candidate": run_file})
        from opsctl.flow.diagnose import release_diagnosis

        return release_diagnosis(_common.inventory(inventory), run_file, limit=limit)
    except ConfigError as e:
        _output.info(f"no \"Why\" section: {e.one_line()}")
        return None


def register(app: typer.Typer) -> None:
    bench_app = typer.Typer(help=(
        "Benchmark the live release (per concurrency level), compare and import results.\n\n"
        "By default the load runs on the inventory's host (loopback to the server) at the gate policy's "
        "levels and repeats; medians over repeats are printed.\n\n"
        "Examples:\n\n"
        "  opsctl bench -i inventories/lab --concurrency 1,4,16 --repeats 2\n\n"
        "  opsctl bench -i inventories/lab --save-baseline      # store the live ar-tp8 as the baseline\n\n"
        "  opsctl bench --url http://127.0.0.1:30000 --concurrency 1 --out results/\n\n"
        "  opsctl bench compare baseline.jsonl candidate.jsonl"), no_args_is_help=False, rich_markup_mode=None)

    @bench_app.callback(invoke_without_command=True)
    def bench_cmd(
        ctx: typer.Context,
        url: Optional[str] = typer.Option(None, "--url", help="Bench this server directly (e.g. http://127.0.0.1:30000 "
                                          "through an SSH tunnel) instead of the inventory's host."),
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        concurrency: Optional[str] = typer.Option(None, "--concurrency", "-c", help=CONCURRENCY_HELP),
        input_len: Optional[int] = typer.Option(None, "--input-len", min=1, help="Prompt tokens (random ids)."),
        output_len: Optional[int] = typer.Option(None, "--output-len", min=1, help="Generated tokens per request."),
        requests_per_level: Optional[int] = typer.Option(None, "--requests-per-level", min=1,
                                                         help="Requests per level (at least C run)."),
        repeats: Optional[int] = typer.Option(None, "--repeats", min=1, max=20, help="Repeats per level (medians compared)."),
        warmup: Optional[int] = typer.Option(None, "--warmup", min=0, help="Warm-up requests, not measured."),
        seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the random prompts."),
        prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", help="JSONL ({input_ids}|{text}) or text lines."),
        workload: Optional[str] = typer.Option(None, "--workload", "-w", help=(
            "What to send: humaneval, chat, math, random, file:PATH (ShareGPT JSON, OpenAI request JSONL, or "
            "prompts one a line), a list (equal weights) or a mix NAME:WEIGHT,... (default: the inventory's gate "
            "policy mix, else humaneval:0.3,chat:0.5,math:0.2). Text goes to /v1/chat/completions.")),
        canary_prompts: int = typer.Option(0, "--canary", min=0, help="Also decode N greedy canary prompts (with --url)."),
        canary_file: Optional[Path] = typer.Option(None, "--canary-file", help="Reference canary to reproduce (with --url)."),
        request_timeout: float = typer.Option(300.0, "--request-timeout", min=1.0, help="Seconds per request."),
        on_controller: bool = typer.Option(False, "--from-controller", help="With --inventory: run the load from this "
                                           "machine through an SSH tunnel instead of on the host."),
        save_baseline: bool = typer.Option(False, "--save-baseline", help="Store this run as the host's baseline for "
                                           "the live (baseline) profile."),
        out: Optional[Path] = typer.Option(None, "--out", help="Write the results (.jsonl) into this directory."),
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Benchmark the live release: per level output tok/s, req/s, TTFT, ITL, E2E, errors, accept length."""
        if ctx.invoked_subcommand is not None:
            return
        _output.set_json(json_out)
        levels = _levels(concurrency)
        reps = repeats
        if url is not None:
            if save_baseline:
                raise ConfigError("--save-baseline needs --inventory (the baseline is stored on the host)",
                                  "opsctl bench --inventory DIR --save-baseline")
            from opsctl.gate.decide import GatePolicy
            with _LevelProgress(reps or GatePolicy().repeats) as prog:
                run = _bench_url(url, concurrency=levels, input_len=input_len, output_len=output_len,
                                 requests_per_level=requests_per_level, repeats=reps, warmup=warmup, seed=seed,
                                 prompt_file=prompt_file, canary_prompts=canary_prompts, canary_file=canary_file,
                                 request_timeout=request_timeout, progress=prog, workload=workload)
            runs = {url: run}
        else:
            if canary_file is not None or canary_prompts:
                raise ConfigError("--canary/--canary-file apply with --url; with --inventory the deploy runs the "
                                  "canary against the host's stored baseline")
            from opsctl.flow.bench import bench_live
            overrides = {k: v for k, v in {"concurrency": levels, "input_len": input_len, "output_len": output_len,
                                           "requests_per_level": requests_per_level, "repeats": repeats,
                                           "warmup": warmup, "seed": seed}.items() if v is not None}
            if workload:
                from opsctl.gate.workloads import parse_mix

                overrides["workloads"] = parse_mix(workload)
            inv_loaded = _common.inventory(inventory)
            shown = 0  # rounds: a level runs until its interval is decided or the cap
            with _LevelProgress(shown) as prog:
                res = bench_live(inv_loaded, limit=limit, overrides=overrides,
                                 prompt_file=prompt_file, save_baseline_run=save_baseline, on_host=not on_controller,
                                 progress=prog)
            runs = res if isinstance(res, dict) else {str(res.meta.get("host", "host")): res}
        written = []
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for name, run in runs.items():
            if out is not None:
                from opsctl.gate.results import write_jsonl
                label = str(run.meta.get("release") or name).split("://", 1)[-1]
                safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
                written.append(write_jsonl(run, out / f"bench-{safe}-{stamp}.jsonl"))
            if json_out:
                _emit_run(run)
            else:
                _print_run(run, f"bench {name}")
        for p in written:
            _output.info(f"wrote {p}")
        bad = [(n, lv.level, lv.errors) for n, r in runs.items() for lv in r.median().levels if lv.errors]
        if bad:
            raise CheckFailed("requests failed during the bench: " + ", ".join(f"{n} C={c}: {e}" for n, c, e in bad),
                              "see error_samples in the results (--json) and the server's journal")
        mism = [n for n, r in runs.items() if r.canary is not None and (r.canary.mismatch or r.canary.error)]
        if mism:
            raise CheckFailed("greedy canary failed on " + ", ".join(mism), "see the canary line above")

    @bench_app.command("compare")
    def compare_cmd(
        a: Path = typer.Argument(..., help="Reference results (.jsonl: opsctl bench or bench_serving), e.g. the baseline."),
        b: Path = typer.Argument(..., help="Results to compare against A."),
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Per-level deltas of B against A (medians over repeats)."""
        from opsctl.gate.results import read_jsonl
        from opsctl.report import compare

        _output.set_json(json_out)
        deltas = compare(read_jsonl(a), read_jsonl(b))
        if json_out:
            _output.emit_json([d.model_dump() for d in deltas])
            return

        from opsctl.report import delta_cell as f

        _output.table(f"{b.name} against {a.name} (medians)",
                      ["C", "A tok/s", "B tok/s", "delta", "A ITL p50", "B ITL p50", "ITL delta", "B accept", "B err"],
                      [[d.label, f(d, "a_tok_s", "%.1f"), f(d, "b_tok_s", "%.1f"), f(d, "tok_s_delta_pct", "%+.1f%%"),
                        f(d, "a_itl_p50_ms", "%.2f"), f(d, "b_itl_p50_ms", "%.2f"), f(d, "itl_delta_pct", "%+.1f%%"),
                        f(d, "b_accept", "%.2f"), f(d, "b_errors", "%d")] for d in deltas])

    @bench_app.command("import")
    def import_cmd(
        file: Path = typer.Argument(..., help="bench_serving results: its --output-file JSONL (any version), its "
                                    "printed 'Serving Benchmark Result' summary (pasted, several, or cut short), or "
                                    "the first JSON result format."),
        out: Path = typer.Option(Path("."), "--out", help="Directory for the converted .jsonl."),
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Convert bench_serving results into opsctl's bench JSONL; each result says its format and the fields
        it lacks (shown as missing by bench compare and report, never as 0).

        Example:

          opsctl bench import pasted-summary.txt --out results/
        """
        from opsctl.gate.results import FORMAT_TEXT, import_results, write_jsonl
        from opsctl.report import level_label

        _output.set_json(json_out)
        run = import_results(file)
        path = write_jsonl(run, out / f"{file.stem}.opsctl.jsonl")
        results = [{"line": lv.source_line, "format": lv.source_format, "concurrency": lv.level or None,
                    "lacks": lv.missing, "derived": lv.derived} for lv in run.levels]
        if json_out:
            _output.emit_json({"ok": True, "path": str(path), "levels": len(run.levels),
                               "concurrency": run.concurrencies(), "results": results})
            return
        _print_run(run, f"imported {file.name}")
        for lv in run.levels:
            lacks = (f"lacks {len(lv.missing)} field(s): {', '.join(lv.missing)}" if lv.missing else "lacks nothing")
            derived = f"; derived: {', '.join(lv.derived)} (mean E2E x completed / duration)" if lv.derived else ""
            _output.info(f"{file}:{lv.source_line}: {FORMAT_TEXT.get(lv.source_format or '', lv.source_format)}, "
                         f"C={level_label(lv)}; {lacks}{derived}")
        _output.info(f"wrote {path}")

    app.add_typer(bench_app, name="bench")

    @app.command("report")
    def report_cmd(
        run_file: str = typer.Argument(..., help="Bench results (.jsonl) of the release, or a RELEASE id on the "
                                       "inventory's host (its stored bench, plotted against the host's baseline)."),
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        baseline: Optional[Path] = typer.Option(None, "--baseline", help="Baseline results (.jsonl) to plot against and judge."),
        out: Path = typer.Option(Path("report"), "--out", help="Output directory."),
        kind: Optional[str] = typer.Option(None, "--kind", help="Profile kind for the gate (default: from the run's "
                                           "metadata, else none)."),
        name: Optional[str] = typer.Option(None, "--name", help="File name stem of the PNG/Markdown/HTML "
                                           "[default: the RELEASE id for a release, 'report' for a file]."),
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Write a PNG plot (tok/s and ITL p50 vs concurrency) and a Markdown/HTML summary with the verdict.

        For a RELEASE id, the summary also has the release's last start from the host's ledger
        (every start-up phase at the site's scale, and against the last start of its profile).

        Examples:

          opsctl report ddtree-b16-3ca2783571 -i inventories/lab --out report/

          opsctl report run.jsonl --baseline baseline.jsonl --out report/
        """
        from opsctl.gate.results import read_jsonl
        from opsctl.gate.decide import GatePolicy, judge
        from opsctl.report import write_report

        _output.set_json(json_out)
        host_policy = start = None
        if Path(run_file).is_file():
            run = read_jsonl(Path(run_file))
            base = read_jsonl(baseline) if baseline is not None else None
        else:
            from opsctl.flow.inspect import release_bench

            run, host_base, host_policy, start = release_bench(_common.inventory(inventory), run_file, limit=limit)
            base = read_jsonl(baseline) if baseline is not None else host_base
        name = report_name(name, run_file)
        verdict = None
        from opsctl.report import lacking_for_verdict
        lacking = lacking_for_verdict(run, base) if base is not None else None
        if lacking:
            _output.info(f"no verdict: {lacking} (an imported result that lacks them is not judged)")
        if base is not None and not lacking:
            pk = kind or str(run.meta.get("profile_kind") or run.meta.get("kind") or "unknown")
            compared = bool(run.canary is not None and run.canary.compared)
            mismatch = run.canary.mismatch if compared else None
            try:
                # the levels and repeats this run measured, with the host's thresholds (a file: the defaults)
                pol = (host_policy or GatePolicy()).model_copy(
                    update={"concurrency": run.concurrencies(), "repeats": max(1, run.repeats)})
                verdict = judge(run, base, pol, profile_kind=pk, canary_mismatch=mismatch,
                                canary_ran=compared if run.canary is not None else False)
            except ConfigError as e:
                _output.info(f"no verdict: {e.one_line()}")
        diagnosis = _report_diagnosis(run, base, run_file, inventory, limit)
        paths = write_report(run, out, base, verdict, name=name, start=start, diagnosis=diagnosis)
        if json_out:
            _output.emit_json({"ok": True, **{k: str(v) for k, v in paths.items()},
                               "verdict": verdict.record() if verdict else None, "startup": start,
                               "diagnosis": diagnosis})
            return
        if verdict is not None:
            _output.info(verdict.table())
            _output.info(verdict.one_line())
        for k, p in paths.items():
            _output.info(f"wrote {k}: {p}")
