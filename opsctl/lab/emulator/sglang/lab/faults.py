"""Faults the emulator reads at start from /etc/opsctl-lab/faults.json (lab host only).

File format: {"faults": {"<name>": {<params>}, ...}} (a bare {"<name>": {...}} works too).
OPSCTL_LAB_FAULTS overrides the path (emulator tests running outside the lab).

name                 params (defaults)                         symptom
capture_failure      message="CUDA error: out of memory"       `Capture cuda graph failed: ...` + hints, exit 1
wrong_verify_tokens  num_tokens_per_req=8, crash=false, band=0 verify graph captured with 8 tokens/req (block
                                                               size, not budget+1); decode lines' accept rate
                                                               implies 8 draft tokens; crash=true: the first
                                                               verify replay dies with a tensor size mismatch.
                                                               With a DDTree budget schedule: only band `band`'s
                                                               graphs get the wrong width
slow_start           load_s=30, warmup_s=0                     weights load for load_s more (port closed), then
                                                               /health* answer 503 for warmup_s more
crash_after          requests=5, exit_code=1                   the scheduler dies after N finished requests
accept_collapse      accept_len=1.58, cpu_tree_ms_per_req=1.0  the site's broken DDTree (budget 32: ~50 tok/s
                                                               at C=1, ~87 at C=128, accept len ~1.5)
host_overhead        ms_per_step=40, ms_per_req=0              host work on every speculative step (a runtime that syncs
                                                               with the host): the step line's verify preparation grows,
                                                               acceptance and the forwards do not (issue #48)
wrong_output         after_tokens=3                            greedy output differs from the target's
port_in_use          (none)                                    the HTTP port cannot be bound (uvicorn's error)
random_loop          text_factor=0.08, ids_factor=1.6          a drafter that only "accepts" on degenerate input:
                                                               random token ids fall into an accepting loop
                                                               (high acceptance), real text accepts almost nothing
code_wins_chat_loses code=1.35, math=0.9, chat=0.08            acceptance by domain skewed: code accepts more,
                                                               chat almost nothing (a release that wins on
                                                               HumanEval and loses on the site's chat)

Every fault takes two optional scopes: algorithm="DDTREE" (or "none") applies it only to a
server started with that --speculative-algorithm; num_draft_tokens=N only to one started with
--speculative-num-draft-tokens N (a DDTree budget B is N = B + 1).

Faults that start healthy and degrade after a delay (seconds since the server
process started, so a release can pass its deploy gates first):
accept_decay         after_s=60, over_s=30, accept_len=1.5,    accept length falls linearly from the healthy
                     onset_file=""                             value to accept_len over over_s (speculative only);
                                                               with onset_file, the fall starts at that file's
                                                               mtime once it exists (a test starts the decay
                                                               when it wants: `touch FILE` in the guest)
error_burst          after_s=60, duration_s=30, rate=0.5       that share of the requests finishing in the burst
                                                               are aborted (HTTP 500, num_aborted_requests_total)
crash_loop           after_s=120, every_s=5, exit_code=1       the scheduler dies after_s after the first start
                                                               with this fault, then every_s after each restart
metrics_off          (none)                                    /metrics answers 404, as without --enable-metrics
"""
from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_PATH = "/etc/opsctl-lab/faults.json"

DEFAULTS: dict[str, dict] = {
    "capture_failure": {"message": "CUDA error: out of memory"},
    "wrong_verify_tokens": {"num_tokens_per_req": 8, "crash": False, "band": 0},
    "slow_start": {"load_s": 30.0, "warmup_s": 0.0},
    "crash_after": {"requests": 5, "exit_code": 1},
    "accept_collapse": {"accept_len": 1.58, "cpu_tree_ms_per_req": 1.0},
    "host_overhead": {"ms_per_step": 40.0, "ms_per_req": 0.0},
    "wrong_output": {"after_tokens": 3},
    "port_in_use": {},
    "random_loop": {"text_factor": 0.08, "ids_factor": 1.6},
    "code_wins_chat_loses": {"code": 1.35, "math": 0.9, "chat": 0.08},
    "accept_decay": {"after_s": 60.0, "over_s": 30.0, "accept_len": 1.5, "onset_file": ""},
    "error_burst": {"after_s": 60.0, "duration_s": 30.0, "rate": 0.5},
    "crash_loop": {"after_s": 120.0, "every_s": 5.0, "exit_code": 1},
    "metrics_off": {},
}


def path() -> Path:
    return Path(os.environ.get("OPSCTL_LAB_FAULTS", DEFAULT_PATH))


def load() -> dict[str, dict]:
    """Active faults with defaults filled in; unknown names are ignored (and reported)."""
    p = path()
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}
    faults = raw.get("faults", raw) if isinstance(raw, dict) else {}
    out = {}
    for name, params in faults.items():
        if name in DEFAULTS:
            out[name] = {**DEFAULTS[name], **(params or {})}
    return out


SCOPES = ("algorithm", "num_draft_tokens")


def for_algorithm(active: dict[str, dict], algorithm: str | None,
                  num_draft_tokens: int | None = None) -> dict[str, dict]:
    """Faults scoped with `algorithm` (e.g. "DDTREE", or "none" for autoregressive)
    apply only to a server started with that --speculative-algorithm, so a test can
    break the release under test and still roll back to a healthy baseline; scoped
    with `num_draft_tokens` too, only to that --speculative-num-draft-tokens (a DDTree
    budget + 1), so the other DDTree releases it rolls back to still start."""
    algo = (algorithm or "none").upper()
    out = {}
    for name, params in active.items():
        scope = params.get("algorithm")
        width = params.get("num_draft_tokens")
        if (scope is None or str(scope).upper() == algo) and \
                (width is None or (num_draft_tokens is not None and int(width) == int(num_draft_tokens))):
            out[name] = {k: v for k, v in params.items() if k not in SCOPES}
    return out


def crash_loop_delay(params: dict) -> float:
    """Seconds after this process's start at which the crash_loop fault kills it:
    after_s for the first start since the fault was set, every_s for every start after
    that (a marker in $OPSCTL_LAB_RUN_DIR remembers the first start across restarts)."""
    run_dir = Path(os.environ.get("OPSCTL_LAB_RUN_DIR", "/run/opsctl-lab"))
    marker = run_dir / "crash_loop.json"
    try:
        key = str(path().stat().st_mtime_ns)
    except OSError:
        key = "-"
    try:
        seen = json.loads(marker.read_text())
    except (OSError, ValueError):
        seen = {}
    if seen.get("faults_file") == key:
        return float(params.get("every_s", 5.0))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"faults_file": key}))
    except OSError:
        pass
    return float(params.get("after_s", 120.0))
