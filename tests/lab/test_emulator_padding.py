"""The emulator pads a running batch without its own graph to the next captured size (SGLang 0.5.23's
BaseCudaGraphRunner._pad_to_bucket): the step runs at the padded batch and is counted in /metrics
(the lab's own counter: SGLang pads silently). Run locally, no lab needed (issue #51)."""
from __future__ import annotations

import re
import sys

from lab_emu import RE_CAPTURE_END, RE_DECODE, Emu, EMULATOR_SRC

sys.path.insert(0, str(EMULATOR_SRC))
from sglang.lab import perf  # noqa: E402  (the emulator's model, imported from its source)

PADDED = re.compile(r'^opsctl_lab:cuda_graph_padded_steps_total\{[^}]*running_bs="(\d+)",graph_bs="(\d+)"\} ([\d.]+)$')
DDTREE32 = ["--tp-size", "8", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "{drafter}",
            "--speculative-num-draft-tokens", "33", "--decode-log-interval", "3"]


def _run(tmp_path, capture: list[str]) -> tuple[list[dict], dict, list[str]]:
    with Emu(tmp_path, DDTREE32 + capture + ["--enable-metrics"]) as emu:
        emu.wait_ready()
        outs = emu.load(5, 120)
        status, body = emu.get("/metrics")
        assert status == 200
    assert all(o["meta_info"]["completion_tokens"] == 120 for o in outs)
    decodes = [m.groupdict() for m in map(RE_DECODE.match, emu.lines) if m]
    padded = {(int(m[1]), int(m[2])): float(m[3]) for m in map(PADDED.match, body.decode().splitlines()) if m}
    captured = [ln for ln in emu.lines if RE_CAPTURE_END.search(ln) and "target verify" in ln]
    return decodes, padded, captured


def test_a_batch_without_its_graph_runs_at_the_next_captured_size_and_is_counted(tmp_path):
    decodes, padded, captured = _run(tmp_path / "chosen", ["--cuda-graph-bs-decode", "1", "2", "8"])
    assert captured and all("bs=[1, 2, 8]" in ln for ln in captured)
    assert padded.get((5, 8), 0) > 0, padded
    assert all(g == (2 if b <= 2 else 8) and b not in (1, 2, 8) for b, g in padded)
    model = perf.Model("tp", "DDTREE", 33, 8)
    domain = perf.domain_of(" ".join(f"w0_{j}" for j in range(16)))
    at_8 = 5 * model.accept_len_for(domain) / (model.step_ms(8) / 1000.0)
    at_5 = model.throughput_for(5, domain)
    steady = [float(d["gen"]) for d in decodes if d["running"] == "5"][1:-1]
    assert steady, decodes
    for gen in steady:   # the forward of 8 x 33 tokens, not 5 x 33: ~35 % slower than with a graph of 5
        assert abs(gen - at_8) / at_8 < 0.12, (gen, at_8, at_5)
    # SGLang's own list captures 5: nothing padded, the step at 5
    decodes, padded, _ = _run(tmp_path / "default", ["--cuda-graph-max-bs-decode", "32"])
    assert (5, 8) not in padded and not any(b == 5 for b, _ in padded)
    steady = [float(d["gen"]) for d in decodes if d["running"] == "5"][1:-1]
    assert steady and all(abs(g - at_5) / at_5 < 0.12 for g in steady), (steady, at_5)
