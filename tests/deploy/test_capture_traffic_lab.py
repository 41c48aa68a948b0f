"""A capture list chosen from the host's traffic, end to end on the lab (issue #51): `deploy
--capture-from-traffic` reads the journal's decode lines (the baseline's bench), renders the chosen
list as --cuda-graph-bs-decode, the start captures exactly those batch sizes, and a batch at a size
without a graph is served padded to the next captured one and counted."""
from __future__ import annotations

import bisect
import json
import re

import pytest

pytestmark = pytest.mark.lab

PADDED = re.compile(r'^opsctl_lab:cuda_graph_padded_steps_total\{[^}]*running_bs="(\d+)",graph_bs="(\d+)"\} ([\d.]+)$')
# n requests at once on the guest, all ignoring EOS for the same length: the running batch is n
BURST = r"""
import json, sys, threading, urllib.request
n = int(sys.argv[1]); out = []
def one(i):
    body = json.dumps({"input_ids": [100 + i] * 16, "sampling_params": {"max_new_tokens": 96, "ignore_eos": True}})
    r = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:30000/generate", body.encode(),
                               {"Content-Type": "application/json"}), timeout=120)
    out.append(len(json.loads(r.read())["output_ids"]))
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps(out))
"""


def padded_counts(lab) -> dict[tuple[int, int], float]:
    text = lab.run("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/metrics', "
                   "timeout=5).read().decode())\"").stdout
    return {(int(m[1]), int(m[2])): float(m[3]) for m in map(PADDED.match, text.splitlines()) if m}


def test_deploy_captures_the_traffic_list_and_pads_a_batch_without_a_graph(clean_lab, baselined, ops):
    baselined.restore(clean_lab)   # ar-tp8 live; its bench's decode lines are the traffic in the journal
    rc, dry, err = ops.json("deploy", "ddtree", "--budget", "16", "--capture-from-traffic", "--dry-run")
    assert rc == 0, err[-3000:]
    plan = dry["outcomes"][0]["capture_plan"]
    chosen = plan["chosen"]
    assert plan["graphs_after"] == len(chosen) < plan["graphs_before"] == 20
    assert plan["capture_s_after"] < plan["capture_s_before"] and plan["padding_after"] <= 0.03
    assert {1, 4, 8, 32} <= set(chosen)            # the lab's gate levels and the profile's largest stay
    assert "the baseline's bench" in plan["forward"]   # the host's forward, fitted to its baseline's steps
    human = ops("deploy", "ddtree", "--budget", "16", "--capture-from-traffic", "--dry-run")
    assert f"graphs captured: 20 -> {len(chosen)}" in human.stdout + human.stderr
    rc, rendered, err = ops.json("render", "ddtree", "--budget", "16", "--capture-from-traffic")
    assert rc == 0, err[-2000:]
    assert rendered["capture_plan"]["chosen"] == chosen
    i = rendered["argv"].index("--cuda-graph-bs-decode")
    assert rendered["argv"][i + 1:i + 1 + len(chosen)] == [str(b) for b in chosen]

    rc, out, err = ops.json("deploy", "ddtree", "--budget", "16", "--capture-from-traffic", "--yes", "--skip-checks")
    assert rc == 0, err[-3000:]
    o = out["outcomes"][0]
    assert o["result"] == "promoted", o
    assert o["capture_plan"]["chosen"] == chosen    # the same traffic, the same choice
    rel = o["release"]
    launch = json.loads(clean_lab.run(f"cat /opt/opsctl/releases/{rel}/launch.json").stdout)
    argv = launch["argv"]
    i = argv.index("--cuda-graph-bs-decode")
    assert argv[i + 1:i + 1 + len(chosen)] == [str(b) for b in chosen]
    assert launch["profile"]["cuda_graph_bs"] == chosen
    # the start's capture lines: exactly those batch sizes, every rank
    lines = clean_lab.run("journalctl -u sglang-k26 -o cat --no-pager | grep 'Capture target verify CUDA graph end' "
                          "| tail -8").stdout.splitlines()
    assert len(lines) == 8
    for line in lines:
        bs = [int(x) for x in re.search(r"bs=\[([\d, ]+)\]", line)[1].split(",")]
        assert bs == chosen, line
    live = ops("validate", "--json")
    assert live.returncode == 0, live.stdout[-2000:]
    found = {f["check"]: f for f in json.loads(live.stdout)["findings"]}
    assert found["capture.batch_list"]["ok"], found["capture.batch_list"]

    # a batch at a size without a graph: served, padded to the next captured size, counted
    n = next(b for b in range(2, chosen[-1]) if b not in chosen)
    graph = chosen[bisect.bisect_left(chosen, n)]
    before = padded_counts(clean_lab)
    res = clean_lab.run(f"python3 - {n}", stdin=BURST, timeout=180)
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [96] * n
    after = padded_counts(clean_lab)
    grew = {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}
    assert grew.get((n, graph), 0) > 0, (n, graph, grew)
    for (b, g) in grew:   # only sizes without their own graph, each to its next captured size
        assert b not in chosen and g == chosen[bisect.bisect_left(chosen, b)], (b, g)
