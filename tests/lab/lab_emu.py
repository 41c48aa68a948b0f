"""Run the SGLang emulator locally (no lab, no root) for emulator tests."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EMULATOR_SRC = REPO / "opsctl" / "lab" / "emulator"
RUNTIME_PACKAGE = REPO / "runtime" / "src" / "sglang_ddtree"

# Regexes written against the exact formats in the SGLang 0.5.23 reference (sglang-0.5.23.md).
PREFIX = r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?: (?P<rank>(?:TP|EP|DP|PP)\d+(?: (?:TP|EP|DP|PP)\d+)*))?\] "
RE_CAPTURE_BEGIN = re.compile(
    PREFIX + r"Capture (?P<name>target verify|target decode|draft decode|draft extend) CUDA graph begin\. "
    r"backend=(?P<backend>\w+), num_tokens_per_req=(?P<n>\d+), avail mem=(?P<avail>[\d.]+) GB$")
RE_CAPTURE_END = re.compile(
    PREFIX + r"Capture (?P<name>target verify|target decode|draft decode|draft extend) CUDA graph end\. "
    r"bs=\[(?P<bs>[\d, ]*)\], elapsed=(?P<elapsed>[\d.]+) s, mem usage=(?P<mem>[\d.]+) GB, "
    r"avail mem=(?P<avail>[\d.]+) GB\.$")
RE_READY = re.compile(PREFIX + r"The server is fired up and ready to roll!$")
RE_DECODE = re.compile(
    PREFIX + r"Decode batch, #running-req: (?P<running>\d+), #token: (?P<tokens>\d+), token usage: (?P<usage>[\d.]+), "
    r"(?:accept len: (?P<accept_len>[\d.]+), accept rate: (?P<accept_rate>[\d.]+), )?"
    r"cuda graph: (?P<cuda_graph>True|False), gen throughput \(token/s\): (?P<gen>[\d.]+), #queue-req: (?P<queue>\d+)$")
RE_PREFILL = re.compile(
    PREFIX + r"Prefill batch, #new-seq: \d+, #new-token: \d+, #cached-token: \d+, #token: \d+, token usage: [\d.]+, "
    r"#running-req: \d+, #queue-req: \d+, #pending-token: \d+, cuda graph: (True|False), "
    r"input throughput \(token/s\): [\d.]+$")
RE_CAPTURE_FAILED = re.compile(r"^Exception: Capture cuda graph failed: .+")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_dirs(tmp: Path, block_size: int = 8, ddtree_plugin: bool = True) -> dict[str, Path]:
    model = tmp / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                   "max_position_embeddings": 262144}))
    drafter = tmp / "drafter"
    drafter.mkdir(parents=True, exist_ok=True)
    (drafter / "config.json").write_text(json.dumps({"block_size": block_size}))
    site = tmp / "site"
    if ddtree_plugin:  # metadata of the runtime wheel: entry point `ddtree` in group sglang.srt.plugins
        di = site / "sglang_ddtree-0.1.0.dist-info"
        di.mkdir(parents=True, exist_ok=True)
        (di / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-ddtree\nVersion: 0.1.0\n")
        (di / "entry_points.txt").write_text("[sglang.srt.plugins]\nddtree = sglang_ddtree.plugin:register\n")
        pkg = site / "sglang_ddtree"   # the package itself: the emulator runs its pure modules (trial set)
        if not pkg.exists():
            pkg.symlink_to(RUNTIME_PACKAGE, target_is_directory=True)
    (tmp / "run").mkdir(exist_ok=True)
    return {"model": model, "drafter": drafter, "site": site, "run": tmp / "run", "faults": tmp / "faults.json"}


class Emu:
    """One emulator process; output collected line by line."""

    def __init__(self, tmp: Path, args: list[str], *, faults: dict | None = None, env: dict | None = None,
                 plugins: str | None = "ddtree", ddtree_plugin: bool = True, port: int | None = None):
        self.dirs = make_dirs(tmp, ddtree_plugin=ddtree_plugin)
        self._port_given = port is not None
        self.port = port or free_port()
        if faults is not None:
            self.dirs["faults"].write_text(json.dumps({"faults": faults}))
        elif self.dirs["faults"].exists():
            self.dirs["faults"].unlink()
        e = dict(os.environ)
        e["PYTHONPATH"] = os.pathsep.join([str(EMULATOR_SRC), str(self.dirs["site"])])
        e["OPSCTL_LAB_FAULTS"] = str(self.dirs["faults"])
        e["OPSCTL_LAB_RUN_DIR"] = str(self.dirs["run"])
        # the JIT caches the first forward fills (never the user's ~/.cache/sglang)
        e["SGLANG_CACHE_DIR"] = str(tmp / "sglang-cache")
        e["SGLANG_JIT_CACHE_DIR"] = str(tmp / "sglang-jit")
        if plugins is None:
            e.pop("SGLANG_PLUGINS", None)
        else:
            e["SGLANG_PLUGINS"] = plugins
        e.update(env or {})
        self._env, self._args, self._cwd = e, args, tmp
        self._spawn()

    def _spawn(self) -> None:
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(self.dirs["model"]),
                "--host", "127.0.0.1", "--port", str(self.port)]
        argv += [a.replace("{drafter}", str(self.dirs["drafter"])) for a in self._args]
        self.argv = argv
        self.proc = subprocess.Popen(argv, env=self._env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=str(self._cwd))
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _lost_port_race(self) -> bool:
        """The port free_port() picked was taken before the server bound it (another test's client
        socket got it from the same ephemeral range): not the emulator's failure, start it again."""
        return (not self._port_given and self.proc.poll() is not None
                and any("[Errno 98]" in line for line in self.lines[-8:]))

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, pattern: str | re.Pattern, timeout: float = 20) -> str | None:
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            while seen < len(self.lines):
                if rx.search(self.lines[seen]):
                    return self.lines[seen]
                seen += 1
            if self.proc.poll() is not None and seen >= len(self.lines):
                self._t.join(timeout=2)
                if seen < len(self.lines):
                    continue
                if self._lost_port_race():
                    self.port = free_port()
                    self._spawn()
                    seen = 0
                    continue
                return None
            time.sleep(0.02)
        return None

    def wait_ready(self, timeout: float = 20) -> None:
        line = self.wait_line(RE_READY, timeout)
        assert line, f"emulator not ready:\n{self.text()[-3000:]}"

    def wait_exit(self, timeout: float = 20) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._t.join(timeout=5)
        return rc

    def get(self, path: str, timeout: float = 30) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str, body: dict, timeout: float = 120) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def generate(self, text: str, max_new: int, temperature: float = 0.0, **extra) -> dict:
        status, body = self.post("/generate", {"text": text, "sampling_params": {
            "max_new_tokens": max_new, "temperature": temperature}, **extra})
        assert status == 200, body
        return json.loads(body)

    def load(self, n: int, max_new: int, prompt_len: int = 16) -> list[dict]:
        def one(i):
            return self.generate(" ".join(f"w{i}_{j}" for j in range(prompt_len)), max_new)

        with ThreadPoolExecutor(max_workers=n) as ex:
            return list(ex.map(one, range(n)))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._t.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
