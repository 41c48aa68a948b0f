"""opsctl diagnose: why a DDTree release lost (acceptance, verify compute, overhead) and what would win."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from opsctl.cli import _common, _output
from opsctl.errors import ConfigError


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose_cmd(
        target: Optional[str] = typer.Argument(None, help="A RELEASE id on the inventory's host (default: the live "
                                               "release), or a file: the release's bench results (.jsonl, "
                                               "bench_serving output) or its journal (decode and step lines)."),
        baseline: Optional[Path] = typer.Option(None, "--baseline", help="The autoregressive baseline's bench "
                                                "results or journal (default for a RELEASE: the host's stored "
                                                "baseline; required for a file)."),
        journal: Optional[Path] = typer.Option(None, "--journal", help="The release's journal (journalctl -u UNIT "
                                               "> FILE, or -o json): its `DDTree step parts:` lines give the "
                                               "measured parts of a step (default for a RELEASE: read on the host)."),
        budget: Optional[int] = typer.Option(None, "--budget", "-b", min=1, help="The DDTree budget the release "
                                             "served, when its files do not say (bench meta, server_args line)."),
        reference_accept: Optional[str] = typer.Option(None, "--reference-accept", metavar="BUDGET:ACCEPT,...",
                                                       help="What this drafter reached elsewhere, e.g. 8:4.48,16:5.3 "
                                                       "(default: the inventory's opsctl.drafter.reference_accept)."),
        inventory: Optional[Path] = _common.InventoryOpt,
        limit: Optional[str] = _common.LimitOpt,
        json_out: bool = _common.JsonOpt,
    ) -> None:
        """Say why a DDTree release lost to the autoregressive baseline, and what would win.

        Per level: accept length, the decode step of each side, the step ratio (= the accept length needed
        to break even), the verify forward over C x (budget + 1) tokens (measured by the runtime's step
        line, else estimated from the baseline's own steps) and the remainder (drafter + tree + host).
        Then the causes ranked by their share of the loss (acceptance, verify_compute, overhead,
        parallelism) with their evidence, and predicted tok/s per budget and level (a prediction:
        'opsctl tune' measures it) with the budget schedule that follows.

        Exit 0 (a diagnosis is not a verdict); 2 when the inputs cannot be read.

        Examples:

          opsctl diagnose -i inventories/lab                      # the live release on the lab host

          opsctl diagnose ddtree-b32-3ca2783571 -i inventories/blackwell

          opsctl diagnose run.jsonl --baseline baseline.jsonl --journal journal.txt --budget 32

          opsctl diagnose site-ddtree.log --baseline site-ar.log --budget 32 --reference-accept 8:4.48,16:5.3
        """
        from opsctl import diagnose as dx

        _output.set_json(json_out)
        ref = dx.parse_reference(reference_accept)
        if target is not None and Path(target).is_file():
            if baseline is None:
                raise ConfigError(f"{target} is a file: the baseline must be given too",
                                  "add --baseline FILE (the autoregressive baseline's bench results or journal)")
            cand = dx.load_input(Path(target))
            base = dx.load_input(baseline)
            parsed = dx.load_input(journal).journal if journal is not None else cand.journal
            if not ref:
                ref = _inventory_reference(inventory)
            base_arg = base.run if base.run is not None else dx.sides_from_journal(base.journal)
            d = dx.from_runs(cand.run, base_arg, budget=budget, reference=ref, journal=parsed,
                             source={"candidate": str(cand.path), "baseline": str(base.path),
                                     "journal": str(journal) if journal else None})
        else:
            if target is not None and ("/" in target or target.endswith((".jsonl", ".json", ".txt", ".log"))):
                raise ConfigError(f"{target}: no such file", "check the path, or pass a release id from "
                                  "'opsctl history'")
            if budget is not None:
                raise ConfigError("--budget applies to files; a release's budget comes from its manifest",
                                  "drop --budget")
            from opsctl.flow.diagnose import release_diagnosis

            d = release_diagnosis(_common.inventory(inventory), target, limit=limit, reference=ref,
                                  baseline_file=baseline, journal_file=journal)
        if json_out:
            _output.emit_json({"ok": True, **d})
            return
        for line in dx.text_lines(d):
            _output.info(line)


def _inventory_reference(inventory: Optional[Path]) -> dict[int, float]:
    """The inventory's drafter reference, when an inventory is named (a file diagnosis needs none)."""
    if inventory is None:
        return {}
    inv = _common.inventory(inventory)
    hosts = inv.select(None)
    return dict(hosts[0].drafter.reference_accept) if hosts else {}
