"""Build the lab's artifacts on this machine: the emulator wheel and a small drafter.

- `sglang-0.5.23+lab-py3-none-any.whl`: distribution `sglang`, version
  `0.5.23+lab` (so `pip install sglang==0.5.23 --no-index --find-links
  <wheelhouse>` picks it, exactly as the production deploy installs the real
  one), built from opsctl/lab/emulator/ with zipfile (stdlib, offline,
  byte-for-byte deterministic: fixed timestamps, sorted entries).
- drafter/: a DFlash-like drafter (config.json with "block_size": 8 and a
  deterministic model.safetensors of a few MiB). Only its shape matters.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import struct
import zipfile
from pathlib import Path

from opsctl.lab import constants as C

EMULATOR_SRC = Path(__file__).resolve().parent / "emulator"
WHEEL_NAME = f"sglang-{C.EMULATOR_VERSION}-py3-none-any.whl"
DIST_INFO = f"sglang-{C.EMULATOR_VERSION}.dist-info"
DRAFTER_MIB = 4
_EPOCH = (2026, 1, 1, 0, 0, 0)

METADATA = f"""Metadata-Version: 2.1
Name: sglang
Version: {C.EMULATOR_VERSION}
Summary: opsctl lab emulator of SGLang 0.5.23 (not SGLang; stdlib only, for the lab host)
Requires-Python: >=3.9
"""
WHEEL = """Wheel-Version: 1.0
Generator: opsctl-lab
Root-Is-Purelib: true
Tag: py3-none-any
"""


def _source_files() -> list[tuple[str, bytes]]:
    root = EMULATOR_SRC / "sglang"
    files = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".json"):
            files.append((p.relative_to(EMULATOR_SRC).as_posix(), p.read_bytes()))
    return files


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel_bytes() -> bytes:
    entries = _source_files()
    entries.append((f"{DIST_INFO}/METADATA", METADATA.encode()))
    entries.append((f"{DIST_INFO}/WHEEL", WHEEL.encode()))
    entries.append((f"{DIST_INFO}/top_level.txt", b"sglang\n"))
    record = "\n".join(_record_line(n, d) for n, d in entries) + f"\n{DIST_INFO}/RECORD,,\n"
    entries.append((f"{DIST_INFO}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return buf.getvalue()


def drafter_files() -> dict[str, bytes]:
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 8,
        "dflash_config": {"block_size": 8, "target_layer_ids": [1, 15, 30, 45, 59], "mask_token_id": 163838},
        "hidden_size": 512, "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2,
        "intermediate_size": 1024, "vocab_size": 163840, "torch_dtype": "bfloat16",
        "opsctl_lab": "generated drafter for the lab (shape only, not a model)",
    }
    # safetensors: 8-byte header length, JSON header, raw data (one BF16 tensor)
    n_bytes = DRAFTER_MIB * 1024 * 1024
    rows = n_bytes // (2 * 512)
    data = bytearray()
    seed = hashlib.sha256(b"opsctl-lab-drafter").digest()
    block = b""
    i = 0
    while len(data) < n_bytes:
        block = hashlib.sha256(seed + i.to_bytes(8, "little")).digest()
        data += block
        i += 1
    data = bytes(data[:n_bytes])
    header = {"__metadata__": {"format": "pt"},
              "fc.weight": {"dtype": "BF16", "shape": [rows, 512], "data_offsets": [0, n_bytes]}}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    st = struct.pack("<Q", len(h)) + h + data
    return {"config.json": (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(), "model.safetensors": st}


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return True


def ensure(wheelhouse: Path = C.WHEELHOUSE, drafter_dir: Path = C.DRAFTER_DIR) -> list[str]:
    """(Re)build what is missing or stale; returns what was written.

    The wheelhouse goes through the production path: the emulator wheel and the runtime
    wheel join it without dependencies and opsctl.wheelhouse writes its pylock.toml, so a
    lab deploy verifies, checks the host's Python/glibc and ships it like the site's."""
    from opsctl import wheelhouse as wh
    from opsctl.artifacts import CACHE_DIR
    from opsctl.buildwheel import cached_runtime_wheel

    built = []
    wheelhouse.mkdir(parents=True, exist_ok=True)
    for stale in wheelhouse.glob("sglang-*.whl"):
        if stale.name != WHEEL_NAME:
            stale.unlink()
    if _write_if_changed(wheelhouse / WHEEL_NAME, build_wheel_bytes()):
        built.append(str(wheelhouse / WHEEL_NAME))
    runtime = cached_runtime_wheel(CACHE_DIR / "wheels")
    before = (wheelhouse / wh.LOCK_NAME).read_bytes() if (wheelhouse / wh.LOCK_NAME).is_file() else b""
    wh.build(wheelhouse, [], wh.Target(C.LAB_PYTHON, C.LAB_PLATFORM), add=[wheelhouse / WHEEL_NAME, runtime])
    if (wheelhouse / wh.LOCK_NAME).read_bytes() != before:
        built.append(str(wheelhouse / wh.LOCK_NAME))
    for name, data in drafter_files().items():
        if _write_if_changed(drafter_dir / name, data):
            built.append(str(drafter_dir / name))
    return built
