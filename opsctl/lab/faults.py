"""Fault injection on the lab host (over SSH). Never used by production code paths.

Two kinds:
- emulator faults: entries of /etc/opsctl-lab/faults.json, read by the
  emulated SGLang server when it starts (so restart the service after a
  change). Names, parameters and symptoms: EMULATOR_FAULTS below and
  opsctl/lab/emulator/sglang/lab/faults.py.
- host conditions, applied at once with transient units in the guest:
  gpu_leftover  a process the emulated nvidia-smi lists as a GPU compute app
                (as a crashed server that left a process holding GPU memory);
  port_holder   a listener on the service port (default 30000), so the
                service cannot bind it and host checks see the port taken.
Every call takes `host`: a node index or a host name ("lab" / "lab1" = node 1,
"lab2".."lab5"; the names inventories/lab-fleet uses); None = node 1.
"""
from __future__ import annotations

import json
import shlex

from opsctl.errors import ConfigError, LabError
from opsctl.lab import constants as C
from opsctl.lab import host as _host

EMULATOR_FAULTS: dict[str, dict] = {
    "capture_failure": {"params": {"message": "CUDA error: out of memory"},
                        "symptom": "'Capture cuda graph failed: ...' + hints in the journal, the server exits 1"},
    "wrong_verify_tokens": {"params": {"num_tokens_per_req": 8, "crash": False, "band": 0},
                            "symptom": "target verify graph captured with num_tokens_per_req=8 (block size, not "
                                       "budget+1); accept rate on decode lines implies 8 draft tokens; crash=true: "
                                       "first verify replay dies with a tensor size mismatch"},
    "slow_start": {"params": {"load_s": 30.0, "warmup_s": 0.0},
                   "symptom": "weight loading takes load_s longer (port closed), /health* answer 503 for warmup_s more"},
    "crash_after": {"params": {"requests": 5, "exit_code": 1},
                    "symptom": "the scheduler dies ('CUDA error: an illegal memory access') after N finished requests"},
    "accept_collapse": {"params": {"accept_len": 1.58, "cpu_tree_ms_per_req": 1.0},
                        "symptom": "the site's broken DDTree: accept len ~1.5, budget 32 ~50 tok/s at C=1, ~87 at C=128"},
    "host_overhead": {"params": {"ms_per_step": 40.0, "ms_per_req": 0.0},
                      "symptom": "host work on every speculative step: the step line's verify preparation grows, "
                                 "acceptance and the forwards do not (opsctl diagnose: overhead)"},
    "wrong_output": {"params": {"after_tokens": 3},
                     "symptom": "greedy output differs from the target's after N tokens"},
    "port_in_use": {"params": {},
                    "symptom": "uvicorn cannot bind the HTTP port ('[Errno 98] ... address already in use'), exit 1"},
    "random_loop": {"params": {"text_factor": 0.08, "ids_factor": 1.6},
                    "symptom": "random token ids fall into an accepting loop (high acceptance), real text accepts "
                               "almost nothing"},
    "code_wins_chat_loses": {"params": {"code": 1.35, "math": 0.9, "chat": 0.08},
                             "symptom": "acceptance skewed by domain: wins on HumanEval, loses on chat"},
    # start healthy, degrade after a delay (seconds since the server process started)
    "accept_decay": {"params": {"after_s": 60.0, "over_s": 30.0, "accept_len": 1.5, "onset_file": ""},
                     "symptom": "healthy for after_s (or until onset_file exists in the guest), then accept length "
                                "falls linearly to accept_len over over_s"},
    "error_burst": {"params": {"after_s": 60.0, "duration_s": 30.0, "rate": 0.5},
                    "symptom": "after after_s, for duration_s, that share of finishing requests is aborted "
                               "(HTTP 500, sglang:num_aborted_requests_total)"},
    "crash_loop": {"params": {"after_s": 120.0, "every_s": 5.0, "exit_code": 1},
                   "symptom": "the scheduler dies ('CUDA error: an illegal memory access') after_s after the first "
                              "start, then every_s after each restart (systemd's Restart= makes it a loop)"},
    "metrics_off": {"params": {},
                    "symptom": "/metrics answers 404, as a server started without --enable-metrics"},
}
HOST_CONDITIONS: dict[str, dict] = {
    "gpu_leftover": {"params": {"memory_mib": 71234},
                     "symptom": "nvidia-smi lists a compute process (and its memory) that no service owns"},
    "port_holder": {"params": {"port": C.SERVICE_PORT},
                    "symptom": "a process listens on the service port"},
}
ALL = {**EMULATOR_FAULTS, **HOST_CONDITIONS}
_UNIT = {"gpu_leftover": "opsctl-lab-gpu-leftover", "port_holder": "opsctl-lab-port-holder"}


def normalise(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    if key not in ALL:
        raise ConfigError(f"unknown lab fault {name!r}", f"one of: {', '.join(n.replace('_', '-') for n in ALL)}")
    return key


def _coerce(value: str):
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    for typ in (int, float):
        try:
            return typ(value)
        except ValueError:
            pass
    return value


def parse_params(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"fault parameter {pair!r} is not key=value")
        k, v = pair.split("=", 1)
        out[k.strip()] = _coerce(v.strip())
    return out


def _read_file(node: C.LabNode) -> dict:
    proc = _host.guest_run(f"cat {C.GUEST_FAULTS_FILE} 2>/dev/null || true", timeout=15, node=node, check=True)
    try:
        data = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except ValueError:
        data = {}
    faults = data.get("faults", data) if isinstance(data, dict) else {}
    return dict(faults)


def _write_file(faults: dict, node: C.LabNode) -> None:
    d = C.GUEST_FAULTS_FILE.rsplit("/", 1)[0]
    if faults:
        _host.guest_run(f"mkdir -p {d} && cat > {C.GUEST_FAULTS_FILE}.tmp && mv {C.GUEST_FAULTS_FILE}.tmp {C.GUEST_FAULTS_FILE}",
                  stdin=json.dumps({"faults": faults}, indent=1, sort_keys=True) + "\n", timeout=15, node=node, check=True)
    else:
        _host.guest_run(f"rm -f {C.GUEST_FAULTS_FILE}", timeout=15, node=node, check=True)


PORT_HOLDER = """import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(8)
print("opsctl lab port holder listening on", sys.argv[1], flush=True)
while True:
    time.sleep(3600)
"""


def _start_condition(name: str, params: dict, node: C.LabNode) -> str:
    """Start the condition's transient unit in the guest (one SSH round trip); returns its main PID."""
    unit = _UNIT[name]
    if name == "gpu_leftover":
        run = "/bin/bash -c " + shlex.quote("exec -a 'python3 -m sglang.launch_server' sleep infinity")
        ready = "true"
        prep = ""
    else:
        port = int(params["port"])
        prep = (f"mkdir -p {C.GUEST_RUN_DIR} && printf %s {shlex.quote(PORT_HOLDER)} > {C.GUEST_RUN_DIR}/port_holder.py; ")
        run = f"/usr/bin/python3 {C.GUEST_RUN_DIR}/port_holder.py {port}"
        ready = f"ss -Htln 'sport = :{port}' | grep -q ."
    script = (f"systemctl stop {unit} 2>/dev/null; systemctl reset-failed {unit} 2>/dev/null; {prep}"
              f"systemd-run --quiet --unit={unit} {run} || exit 1; "
              f"for i in $(seq 200); do pid=$(systemctl show -p MainPID --value {unit}); "
              f"if [ -n \"$pid\" ] && [ \"$pid\" != 0 ] && {ready}; then echo $pid; exit 0; fi; sleep 0.05; done; "
              f"systemctl status --no-pager {unit}; journalctl -u {unit} --no-pager -n 20; exit 1")
    proc = _host.guest_run(script, timeout=40, node=node)
    if proc.returncode != 0:
        raise LabError(f"could not start {unit} on lab host {node.name}: {(proc.stdout + proc.stderr).strip()[-600:]}")
    pid = proc.stdout.strip().splitlines()[-1]
    if name == "gpu_leftover":
        reg = json.dumps({"pid": int(pid), "name": "python3", "used_memory_mib": int(params["memory_mib"]),
                          "gpus": list(range(8)), "opsctl_lab_fault": "gpu_leftover"})
        _host.guest_run(f"mkdir -p {C.GUEST_RUN_DIR}/gpu-procs && cat > {C.GUEST_RUN_DIR}/gpu-procs/{pid}.json",
                  stdin=reg, timeout=10, node=node, check=True)
    return pid


def _stop_condition(name: str, node: C.LabNode) -> None:
    unit = _UNIT[name]
    _host.guest_run(f"pid=$(systemctl show -p MainPID --value {unit} 2>/dev/null); "
              f"systemctl stop {unit} 2>/dev/null; systemctl reset-failed {unit} 2>/dev/null; "
              f"[ -n \"$pid\" ] && rm -f {C.GUEST_RUN_DIR}/gpu-procs/$pid.json; "
              f"grep -l '\"opsctl_lab_fault\"' {C.GUEST_RUN_DIR}/gpu-procs/*.json 2>/dev/null | xargs -r rm -f; true",
              timeout=20, node=node)


def set_fault(name: str, host: "int | str | None" = None, **params) -> dict:
    """Activate a fault on one lab host (node 1 unless `host` says); returns its effective parameters."""
    node = C.resolve_node(host)
    key = normalise(name)
    # every emulator fault can be scoped to one --speculative-algorithm ("DDTREE", "none" = autoregressive)
    # and to one --speculative-num-draft-tokens (a DDTree budget + 1)
    allowed = set(ALL[key]["params"]) | ({"algorithm", "num_draft_tokens"} if key in EMULATOR_FAULTS else set())
    unknown = set(params) - allowed
    if unknown:
        raise ConfigError(f"fault {key} has no parameter(s) {', '.join(sorted(unknown))}",
                          f"parameters: {', '.join(sorted(allowed)) or '(none)'}")
    effective = {**ALL[key]["params"], **params}
    if key in HOST_CONDITIONS:
        effective["pid"] = int(_start_condition(key, effective, node))
        return effective
    faults = _read_file(node)
    faults[key] = effective
    _write_file(faults, node)
    return effective


def clear_fault(name: str | None = None, host: "int | str | None" = None) -> list[str]:
    """Clear one fault, or all (name None), on one lab host (node 1 unless `host` says). Returns the names cleared."""
    node = C.resolve_node(host)
    cleared = []
    keys = [normalise(name)] if name else list(ALL)
    file_faults = _read_file(node)
    changed = False
    for key in keys:
        if key in HOST_CONDITIONS:
            if name or active_conditions(node).get(key):
                _stop_condition(key, node)
                cleared.append(key)
        elif key in file_faults:
            file_faults.pop(key)
            changed = True
            cleared.append(key)
    if changed or not name:
        _write_file(file_faults, node)
    return cleared


def active_conditions(host: "int | str | C.LabNode | None" = None) -> dict[str, bool]:
    node = C.resolve_node(host)
    out = {}
    for key, unit in _UNIT.items():
        out[key] = _host.guest_run(f"systemctl is-active --quiet {unit}", timeout=10, node=node).returncode == 0
    return out


def list_faults(host: "int | str | None" = None) -> dict:
    """{"active": {name: params}, "available": {name: {"params", "symptom"}}, "file", "host"} of one lab host."""
    node = C.resolve_node(host)
    active = dict(_read_file(node))
    for key, on in active_conditions(node).items():
        if on:
            active[key] = {"unit": _UNIT[key]}
    return {"active": active, "available": ALL, "file": C.GUEST_FAULTS_FILE, "host": node.name,
            "address": node.guest_ip}
