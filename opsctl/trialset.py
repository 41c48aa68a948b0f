"""DDTree trial sets (issue #37): the candidate budgets and budget schedules one release
captures at start, and the control file that switches which one serves, live.

The runtime's interface (runtime/README.md, "Trial set and live switch"):

* the release carries `ddtree-trialset.json`, named by SGLANG_DDTREE_TRIAL_SET_FILE:
  `{"candidates": ["4", "8", "16", "1:16,3:4,16:0"], "active": "4"}`. The widest width any
  candidate needs (largest budget + 1) is the server's --speculative-num-draft-tokens; the
  runtime refuses a schedule file beside it (a schedule is a candidate here);
* SGLANG_DDTREE_CONTROL_FILE names `{"active": "<candidate>"}`, written atomically (a temporary
  file in its directory, then a rename). It is read every 16 decode steps; a present control file
  overrides the trial set's `active` from the first check on, so a restart comes back serving it.
  A candidate not in `candidates` is refused (`DDTree control refused: ... was not captured`):
  whatever may be switched to must be listed before the start.

The control file lives outside the release (`<root>/shared/control/`), so switching never
changes a release's files, and is named after the candidate list: releases that capture the
same candidates share it, any other trial release has its own.

Pure: names, file contents and checks; no I/O (opsctl/trialswitch.py writes and waits).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import PurePosixPath

from opsctl import schedule as schedule_mod
from opsctl.errors import ConfigError

TRIAL_SET_FILE = "ddtree-trialset.json"
TRIAL_SET_ENV = schedule_mod.TRIAL_SET_ENV   # the runtime's names, kept in opsctl.schedule
CONTROL_ENV = schedule_mod.CONTROL_ENV
CONTROL_DIR = "shared/control"   # under the install root; the prepare play makes it, owned by the service user
_BUDGET = re.compile(r"^\s*\d+\s*$")
EXAMPLE = "4,8,16 1:16,6:0"


def canonical(candidate: str | int, *, what: str = "--trial-set") -> str:
    """The runtime's name of a candidate: a budget `16` (also written `1:16`: one band from batch 1)
    or a schedule in the grammar of opsctl.schedule, `1:16,3:4,16:0`. ConfigError on anything else."""
    text = str(candidate).strip()
    if _BUDGET.match(text):
        budget = int(text)
        if budget < 1:
            raise ConfigError(f"{what}: budget {budget} alone drafts nothing (a lone budget 0 is no candidate)",
                              "use budget 0 as a band of a schedule, e.g. 1:16,6:0")
        return str(budget)
    return schedule_mod.candidate_name(schedule_mod.parse(text, what=what))


def budgets_of(candidate: str) -> list[int]:
    """Every budget a candidate's bands draw with (0 included)."""
    if _BUDGET.match(candidate):
        return [int(candidate)]
    return [b.budget for b in schedule_mod.parse(candidate).bands]


def is_schedule(candidate: str) -> bool:
    return not _BUDGET.match(candidate)


def parse_cli(text: str) -> list[str]:
    """`--trial-set "4,8,16 1:16,6:0"`: whitespace- (or ';'-) separated parts; a part with a ':' is one
    schedule, any other part a comma-separated list of budgets. Canonical names, in order, once each."""
    out: list[str] = []
    parts = [p for p in re.split(r"[\s;]+", text or "") if p]
    if not parts:
        raise ConfigError("--trial-set is empty", f"e.g. --trial-set \"{EXAMPLE}\"")
    for part in parts:
        items = [part] if ":" in part else [x for x in part.split(",") if x.strip()]
        for item in items:
            if ":" not in item and not _BUDGET.match(item):
                raise ConfigError(f"--trial-set {text!r}: {item!r} is neither a budget nor a schedule",
                                  f"write budgets comma-separated and each schedule as its own part, e.g. "
                                  f"--trial-set \"{EXAMPLE}\"")
            name = canonical(item)
            if name not in out:
                out.append(name)
    return out


def check_candidates(candidates: list[str] | tuple[str, ...], *, capture_bs: list[int], allow_torch_beam: bool,
                     what: str = "--trial-set") -> None:
    """What the runtime refuses at start, refused here before anything is staged: a name that is not
    canonical, one listed twice, a schedule band that holds no captured batch size, a budget above
    the fused tree kernel's range (unless the profile opts in)."""
    if not candidates:
        raise ConfigError(f"{what}: no candidates", f"e.g. --trial-set \"{EXAMPLE}\"")
    seen: set[str] = set()
    for c in candidates:
        name = canonical(c, what=what)
        if name != c:
            raise ConfigError(f"{what}: candidate {c!r} is written {name!r} by the runtime",
                              "list candidates by their canonical names (a one-band schedule 1:B is the budget B)")
        if name in seen:
            raise ConfigError(f"{what}: candidate {name} is listed twice", "list each candidate once")
        seen.add(name)
        if is_schedule(name):
            schedule_mod.check_for_server(schedule_mod.parse(name), capture_bs=capture_bs,
                                          allow_torch_beam=allow_torch_beam, what=f"{what} candidate")
        else:
            schedule_mod.check_budget(int(name), allow_torch_beam=allow_torch_beam, what=f"{what} candidate {name}")


def max_budget(candidates: list[str] | tuple[str, ...]) -> int:
    """The budget the server is sized for: its --speculative-num-draft-tokens is this + 1."""
    return max(b for c in candidates for b in budgets_of(c))


def draft_budgets(candidates: list[str] | tuple[str, ...]) -> list[int]:
    """Distinct budgets > 0 (one draft head each in the runtime), smallest first."""
    return sorted(schedule_mod.trial_draft_budgets(candidates))


def trial_set_json(candidates: list[str] | tuple[str, ...], active: str | None = None,
                   trial_bs: list[int] | tuple[int, ...] | None = None) -> str:
    """The release's trial-set file. `active` (default: the first candidate) serves from the start
    until a control file names another; `trial_bs` (the tune's levels): the other candidates capture
    only the batch sizes these reach (the runtime's TrialSet.band_bs)."""
    active = active or candidates[0]
    if active not in candidates:
        raise ConfigError(f"trial set: active {active} is not a candidate", "name one of the candidates")
    doc: dict = {"candidates": list(candidates), "active": active}
    if trial_bs:
        doc["trial_bs"] = sorted(set(int(b) for b in trial_bs))
    return json.dumps(doc, indent=2) + "\n"


def control_json(candidate: str) -> str:
    return json.dumps({"active": candidate}) + "\n"


def candidates_digest(candidates: list[str] | tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(candidates).encode()).hexdigest()[:10]


def control_path(install_root: PurePosixPath, candidates: list[str] | tuple[str, ...]) -> PurePosixPath:
    """`<root>/shared/control/ddtree-active-<digest of the candidate list>.json`: outside every release
    (a switch changes no release file) and one per candidate list (a trial release with other
    candidates never reads a choice made for this one)."""
    return install_root / CONTROL_DIR / f"ddtree-active-{candidates_digest(candidates)}.json"


def describe(candidates: list[str] | tuple[str, ...]) -> str:
    """`budgets 4, 8, 16 and 12 schedules` (plans and labels; the runtime's line lists them all)."""
    budgets = [c for c in candidates if not is_schedule(c)]
    schedules = [c for c in candidates if is_schedule(c)]
    out = f"budget{'s' if len(budgets) != 1 else ''} {', '.join(budgets)}" if budgets else ""
    if schedules:
        more = f"{len(schedules)} schedule{'s' if len(schedules) != 1 else ''}" if len(schedules) > 2 \
            else "schedule" + ("s " if len(schedules) > 1 else " ") + ", ".join(schedules)
        out = f"{out} and {more}" if out else more
    return out
