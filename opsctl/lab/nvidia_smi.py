#!/usr/bin/python3
"""Emulated `nvidia-smi` (opsctl lab only: installed at /usr/local/bin/nvidia-smi inside the lab guest).

Prints the site's 8 x NVIDIA RTX PRO 6000 Blackwell Workstation Edition
(97887 MiB each). Compute processes come from the emulator's registry
($OPSCTL_LAB_RUN_DIR/gpu-procs, default /run/opsctl-lab/gpu-procs): the
running emulator's PID, and any leftover the lab injected
(`opsctl lab fault set gpu-leftover`). Supported:
  nvidia-smi
  nvidia-smi -L
  nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits] [-i N]
      fields: index,name,memory.total,memory.used,memory.free,driver_version,
              uuid,pci.bus_id,utilization.gpu,temperature.gpu,power.draw,compute_cap,count
  nvidia-smi --query-compute-apps=<pid,process_name,used_memory,gpu_uuid,gpu_bus_id> --format=csv[,...]
Not a real nvidia-smi: anything else exits 2 with a note.
"""
import json
import os
import sys
import time
from pathlib import Path

NAME = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
TOTAL_MIB = 97887
DRIVER = "580.95.05"
CUDA = "13.0"
N_GPUS = 8
BUS = ["00000000:01:00.0", "00000000:21:00.0", "00000000:41:00.0", "00000000:61:00.0",
       "00000000:81:00.0", "00000000:A1:00.0", "00000000:C1:00.0", "00000000:E1:00.0"]
BASE_USED_MIB = 4


def uuid(i):
    return f"GPU-5e1ab{i:03d}-6000-4b1c-9e7a-0000000060{i:02d}"


def procs():
    d = Path(os.environ.get("OPSCTL_LAB_RUN_DIR", "/run/opsctl-lab")) / "gpu-procs"
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            p = json.loads(f.read_text())
            pid = int(p["pid"])
            if not Path(f"/proc/{pid}").exists():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() or p.get("name", "python3")
            except OSError:
                cmd = p.get("name", "python3")
            out.append({"pid": pid, "name": cmd, "mib": int(p.get("used_memory_mib", 0)),
                        "gpus": [int(g) for g in p.get("gpus", range(N_GPUS))]})
        except (OSError, ValueError, KeyError):
            continue
    return out


def used(i, ps):
    return BASE_USED_MIB + sum(p["mib"] for p in ps if i in p["gpus"])


def gpu_field(field, i, ps, units):
    u = used(i, ps)
    busy = any(i in p["gpus"] for p in ps)
    vals = {
        "index": str(i), "name": NAME, "gpu_name": NAME, "count": str(N_GPUS),
        "memory.total": f"{TOTAL_MIB}" + ("" if not units else " MiB"),
        "memory.used": f"{u}" + ("" if not units else " MiB"),
        "memory.free": f"{TOTAL_MIB - u}" + ("" if not units else " MiB"),
        "driver_version": DRIVER, "uuid": uuid(i), "gpu_uuid": uuid(i), "pci.bus_id": BUS[i],
        "utilization.gpu": ("0" if not busy else "37") + ("" if not units else " %"),
        "temperature.gpu": "34" if not busy else "51",
        "power.draw": ("21.43" if not busy else "187.20") + ("" if not units else " W"),
        "compute_cap": "12.0", "persistence_mode": "Enabled", "pstate": "P8" if not busy else "P1",
    }
    if field not in vals:
        print(f'Field "{field}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
    return vals[field]


def header(fields, units):
    unit = {"memory.total": " [MiB]", "memory.used": " [MiB]", "memory.free": " [MiB]", "used_memory": " [MiB]",
            "utilization.gpu": " [%]", "power.draw": " [W]"}
    return ", ".join(f + (unit.get(f, "") if units else "") for f in fields)


def parse_format(args):
    fmt = ""
    for a in args:
        if a.startswith("--format="):
            fmt = a.split("=", 1)[1]
    opts = set(fmt.split(",")) if fmt else set()
    return ("csv" in opts), ("noheader" in opts), ("nounits" not in opts)


def table(ps):
    now = time.strftime("%a %b %d %H:%M:%S %Y")
    lines = [now,
             "+-----------------------------------------------------------------------------------------+",
             f"| NVIDIA-SMI {DRIVER}              Driver Version: {DRIVER}      CUDA Version: {CUDA}     |",
             "|-----------------------------------------+------------------------+----------------------+",
             "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
             "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
             "|=========================================+========================+======================|"]
    for i in range(N_GPUS):
        u = used(i, ps)
        busy = any(i in p["gpus"] for p in ps)
        lines.append(f"|   {i}  NVIDIA RTX PRO 6000 Blac...    On  |   {BUS[i]} Off |                  Off |")
        lines.append(f"| 30%   {'51' if busy else '34'}C    {'P1' if busy else 'P8'}           "
                     f"{'187' if busy else ' 21'}W /  600W |  {u:>6}MiB /  {TOTAL_MIB}MiB |    "
                     f"{'37' if busy else ' 0'}%      Default |")
        lines.append("+-----------------------------------------+------------------------+----------------------+")
    lines += ["", "+-----------------------------------------------------------------------------------------+",
              "| Processes:                                                                              |",
              "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
              "|        ID   ID                                                               Usage      |",
              "|=========================================================================================|"]
    rows = [(g, p) for p in ps for g in p["gpus"]]
    if not rows:
        lines.append("|  No running processes found                                                             |")
    for g, p in rows:
        lines.append(f"|  {g:>3}   N/A  N/A  {p['pid']:>15}      C   {p['name'][:32]:<32}  {p['mib']:>8}MiB |")
    lines.append("+-----------------------------------------------------------------------------------------+")
    print("\n".join(lines))


def main(argv):
    ps = procs()
    if not argv:
        table(ps)
        return 0
    if argv[0] in ("-L", "--list-gpus"):
        for i in range(N_GPUS):
            print(f"GPU {i}: {NAME} (UUID: {uuid(i)})")
        return 0
    if argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    gpus = list(range(N_GPUS))
    for j, a in enumerate(argv):
        if a in ("-i", "--id") and j + 1 < len(argv):
            gpus = [int(x) for x in argv[j + 1].split(",")]
        elif a.startswith("--id="):
            gpus = [int(x) for x in a.split("=", 1)[1].split(",")]
    q = [a for a in argv if a.startswith("--query-gpu=")]
    if q:
        fields = [f.strip() for f in q[0].split("=", 1)[1].split(",") if f.strip()]
        csv, noheader, units = parse_format(argv)
        if not csv:
            print("ERROR: --query-gpu needs --format=csv", file=sys.stderr)
            return 2
        if not noheader:
            print(header(fields, units))
        for i in gpus:
            print(", ".join(gpu_field(f, i, ps, units) for f in fields))
        return 0
    q = [a for a in argv if a.startswith("--query-compute-apps=")]
    if q:
        fields = [f.strip() for f in q[0].split("=", 1)[1].split(",") if f.strip()]
        csv, noheader, units = parse_format(argv)
        if not noheader:
            print(header(fields, units))
        for p in ps:
            for g in p["gpus"]:
                if g not in gpus:
                    continue
                vals = {"pid": str(p["pid"]), "process_name": p["name"], "name": p["name"],
                        "used_memory": f"{p['mib']}" + (" MiB" if units else ""), "gpu_uuid": uuid(g),
                        "gpu_bus_id": BUS[g], "gpu_name": NAME}
                print(", ".join(vals.get(f, "[N/A]") for f in fields))
        return 0
    print(f"opsctl lab nvidia-smi: unsupported arguments {argv!r} (emulated; see docs/lab.md)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
