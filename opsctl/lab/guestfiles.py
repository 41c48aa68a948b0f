"""Files placed into the lab guest's overlay (upper dir) at boot: they exist in the guest only.

- /root/.ssh/authorized_keys         the lab's generated key
- /usr/local/bin/nvidia-smi          emulated (opsctl/lab/nvidia_smi.py)
- /usr/local/cuda/bin/nvcc           only when this machine has no CUDA toolkit: an emulated
                                     `nvcc --version` (CUDA 13.0) + /usr/local/bin/nvcc link; otherwise
                                     the guest sees the machine's real toolkit through the overlay
- /srv/models/kimi-k2.6/config.json  the target model path the lab inventory points at
- /etc/opsctl-lab/                   where faults.json goes (`opsctl lab fault set`)
- /root/.bashrc                      a plain root shell: the guest boots over this machine's /, whose
                                     ~/.bashrc (pyenv, cargo) is sourced by every non-interactive SSH
                                     command (~0.25 s of CPU each, and `python3` a pyenv shim)
- /etc/ssh/sshd_config.d/opsctl-lab.conf  sshd without PAM: a deploy opens a few dozen SSH sessions,
                                     and each PAM session (logind scope, motd scripts) cost the guest
                                     ~0.2 s of CPU on a 2-core machine that also runs the tests
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from opsctl.lab import constants as C

NVCC = """#!/bin/sh
# opsctl lab: emulated nvcc (the lab has no CUDA toolkit). Only --version is meaningful.
case "$1" in
  --version|-V)
    echo "nvcc: NVIDIA (R) Cuda compiler driver"
    echo "Copyright (c) 2005-2025 NVIDIA Corporation"
    echo "Built on Wed_Aug_20_01:58:59_PM_PDT_2025"
    echo "Cuda compilation tools, release 13.0, V13.0.88"
    echo "Build cuda_13.0.r13.0/compiler.36424714_0"
    exit 0;;
  *) echo "nvcc (opsctl lab emulation): cannot compile here" >&2; exit 1;;
esac
"""

MODEL_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61,
                    "n_routed_experts": 384, "num_experts_per_tok": 8, "vocab_size": 163840},
    "max_position_embeddings": 262144,
    "opsctl_lab": "stand-in for the site's Kimi K2.6 checkpoint (config only)",
}

SSHD_CONF = """# opsctl lab only: no PAM session per login (no logind scope, no motd scripts); key login as before
UsePAM no
PrintMotd no
PrintLastLog no
# the lab's own commands share one connection per guest (constants.SSH_MUX_OPTIONS); tests run
# several at once (default 10 sessions per connection)
MaxSessions 64
"""

GUEST_BASHRC = """# ~/.bashrc of root on the opsctl lab host (guest only): a plain Debian root shell.
# PS1 and umask come from /etc/profile.
"""

README = """This directory exists on the opsctl lab host only.
faults.json here is read by the emulated SGLang server at start; see docs/lab.md.
Written by 'opsctl lab fault set|clear' and by tests, never by production code.
"""


def real_nvcc() -> str | None:
    """A CUDA toolkit on this machine is visible in the guest too (the guest boots over /)."""
    for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc", "/usr/bin/nvcc"):
        if Path(p).exists():
            return p
    return None


def write_tree(root: Path, authorized_key: str) -> None:
    def put(rel: str, data: str | bytes, mode: int = 0o644) -> None:
        p = root / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        os.chmod(p, mode)

    put("/root/.ssh/authorized_keys", authorized_key, 0o600)
    os.chmod(root / "root/.ssh", 0o700)
    put(C.GUEST_NVIDIA_SMI, (Path(__file__).with_name("nvidia_smi.py")).read_bytes(), 0o755)
    if not real_nvcc():
        # no CUDA toolkit on this machine: the guest gets an emulated nvcc (guest only)
        put("/usr/local/cuda-13.0/bin/nvcc", NVCC, 0o755)
        for rel, target in (("usr/local/cuda", "/usr/local/cuda-13.0"), ("usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc")):
            link = root / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink() and not link.exists():
                link.symlink_to(target)
    put(f"{C.GUEST_MODEL_PATH}/config.json", json.dumps(MODEL_CONFIG, indent=2) + "\n")
    put("/etc/opsctl-lab/README", README)
    put("/etc/ssh/sshd_config.d/opsctl-lab.conf", SSHD_CONF)
    put("/root/.bashrc", GUEST_BASHRC)
    (root / C.GUEST_RUN_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
