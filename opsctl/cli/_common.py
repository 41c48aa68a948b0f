"""Options shared by several commands, so they read and behave the same everywhere.

Nothing of the core is imported here at module level: `opsctl --help` and a command that needs
no inventory do not pay for opsctl.config (pydantic, yaml) at start."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:
    from opsctl.config import Inventory

INVENTORY_HELP = ("Inventory directory (Ansible layout: hosts.yml, group_vars/, host_vars/). "
                  "Default: $OPSCTL_INVENTORY, else inventories/lab.")

InventoryOpt = typer.Option(None, "--inventory", "-i", envvar="OPSCTL_INVENTORY", help=INVENTORY_HELP,
                            show_default=False)
LimitOpt = typer.Option(None, "--limit", "-l", help="Act on this host or group only (comma-separated).")
CaptureFromTrafficOpt = typer.Option(
    False, "--capture-from-traffic", help="Capture only the decode batch sizes the host's traffic uses (its journal's "
    "'Decode batch' lines over --traffic-since), the gate's levels and the largest batch needed: the fewest CUDA "
    "graphs whose padding costs at most --max-padding of decode time; rendered as --cuda-graph-bs-decode.")
TrafficSinceOpt = typer.Option("24h", "--traffic-since", metavar="WINDOW",
                               help="The traffic window for --capture-from-traffic: 24h, 90m, 2d, or a journalctl "
                               "--since time.")
MaxPaddingOpt = typer.Option(0.03, "--max-padding", metavar="SHARE", min=0.0, max=0.5,
                             help="--capture-from-traffic: the most of decode time padding may cost (0.03: 3 %).")


def capture_options(on: bool, since: str, max_padding: float) -> dict | None:
    return {"since": since, "max_padding": max_padding} if on else None


JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON on stdout (human text goes to stderr).")
BudgetOpt = typer.Option(None, "--budget", "-b", help="DDTree node budget N (>= 1); the verify width is N + 1. "
                         "Only for the ddtree profile.", show_default=False)
ScheduleOpt = typer.Option(None, "--budget-schedule", metavar="MIN_BATCH:BUDGET,...",
                           help="DDTree budget by running batch size, e.g. 1:32,8:16,32:8,64:0 (batches of 1-7 get "
                           "budget 32, 8-31 get 16, 32-63 get 8, 64+ decode without a tree; a batch takes the "
                           "band of the CUDA-graph batch size it pads to). Each band must hold a captured size; "
                           "'opsctl tune' builds one from the host's traffic. --budget N is the one-band case 1:N.",
                           show_default=False)


def inventory(path: Optional[Path]) -> Inventory:
    from opsctl.config import load_inventory

    return load_inventory(path or Path("inventories/lab"))
