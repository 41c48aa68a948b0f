"""opsctl.journal: real-format SGLang lines (0.5.23, legacy, variants) -> typed events."""
from __future__ import annotations

import json

import pytest

from opsctl import journal
from opsctl.host import facts
from opsctl.errors import ConfigError, HostError
from opsctl.host.connection import Result
from validate_lines import DATA, SITE_LINES, begin, decode_line, end


def only_capture(parsed: journal.ParsedJournal) -> journal.Capture:
    assert len(parsed.captures) == 1, parsed.captures
    return parsed.captures[0]


# --------------------------------------------------------------------------- capture lines


def test_0523_verify_begin_and_end_fields():
    cap = only_capture(journal.parse([begin("target verify", 17, "TP3"),
                                      end("target verify", (1, 2, 4, 8), "TP3")]))
    assert cap.kind == journal.TARGET_VERIFY and cap.rank == "TP3" and cap.tp_rank == 3
    assert cap.complete and cap.backend == "full" and cap.num_tokens_per_req == 17
    assert cap.bs == (1, 2, 4, 8) and cap.elapsed_s == 40.5
    assert cap.mem_usage_gb == 2.87 and cap.avail_mem_after_gb == 14.01
    assert cap.begin.avail_mem_gb == 16.88


@pytest.mark.parametrize("kind", ["target decode", "draft decode", "draft extend", "draft verify"])
def test_0523_other_graph_kinds(kind):
    cap = only_capture(journal.parse([begin(kind, 1), end(kind)]))
    assert cap.kind == kind and cap.complete


def test_target_prefill_sizes_by_tokens():
    parsed = journal.parse([
        "[2026-05-30 00:21:00 TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=8192, avail mem=20.00 GB",
        "[2026-05-30 00:21:09 TP0] Capture target prefill CUDA graph end. elapsed=9.10 s, mem usage=0.80 GB, avail mem=19.20 GB.",
    ])
    cap = only_capture(parsed)
    assert cap.kind == journal.TARGET_PREFILL and cap.begin.num_tokens == 8192 and cap.num_tokens_per_req is None
    assert cap.bs is None and cap.mem_usage_gb == 0.8 and cap.elapsed_s == 9.1


def test_legacy_spelling_up_to_0510():
    cap = only_capture(journal.parse([
        "[2025-03-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=76.13 GB",
        "[2025-03-01 10:00:25 TP0] Capture cuda graph end. Time elapsed: 25.12 s. mem usage=1.23 GB. avail mem=74.90 GB.",
    ]))
    assert cap.kind == journal.LEGACY and cap.complete
    assert cap.elapsed_s == 25.12 and cap.mem_usage_gb == 1.23 and cap.avail_mem_after_gb == 74.9
    assert cap.num_tokens_per_req is None


def test_04x_end_line_without_mem_usage_and_separate_bs_line():
    parsed = journal.parse([
        "[2024-11-02 08:00:00 TP1] Capture cuda graph begin. This can take up to several minutes.",
        "[2024-11-02 08:00:00 TP1] Capture cuda graph bs [1, 2, 4, 8, 16]",
        "[2024-11-02 08:00:12 TP1] Capture cuda graph end. Time elapsed: 12.34 s",
    ])
    cap = only_capture(parsed)
    assert cap.complete and cap.elapsed_s == 12.34 and cap.mem_usage_gb is None and cap.bs == (1, 2, 4, 8, 16)


def test_04x_draft_capture_is_unlabelled_so_two_legacy_pairs():
    lines = ["[2024-11-02 08:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.",
             "[2024-11-02 08:00:12 TP0] Capture cuda graph end. Time elapsed: 12.34 s",
             "[2024-11-02 08:00:13 TP0] Capture cuda graph begin. This can take up to several minutes.",
             "[2024-11-02 08:00:15 TP0] Capture cuda graph end. Time elapsed: 2.01 s"]
    parsed = journal.parse(lines)
    assert [c.kind for c in parsed.captures] == [journal.LEGACY] * 2
    assert [c.elapsed_s for c in parsed.captures] == [12.34, 2.01]
    assert parsed.log_format == "legacy"


def test_variant_bs_on_begin_line_and_num_tokens_per_bs():
    cap = only_capture(journal.parse([
        "[2026-02-01 09:00:00 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_bs=17, "
        "bs=[1, 2, 4, 8, 16], avail mem=30.00 GB",
        "[2026-02-01 09:00:30 TP0] Capture target verify CUDA graph end. elapsed=30.00 s, mem usage=2.00 GB, avail mem=28.00 GB.",
    ]))
    assert cap.num_tokens_per_req == 17 and cap.bs == (1, 2, 4, 8, 16) and cap.complete


def test_fields_in_any_order_and_eagle_draft_begin_with_bs():
    ev = journal.parse_capture(journal.LogLine(
        "Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2], avail mem=9.00 GB", 1))
    assert ev is not None and ev.kind == journal.DRAFT_DECODE and ev.num_tokens_per_req == 4 and ev.bs == (1, 2)
    ev = journal.parse_capture(journal.LogLine("Capture target verify CUDA graph end. avail mem=1.00 GB, "
                                               "mem usage=2.00 GB, elapsed=3.00 s, bs=[8]", 1))
    assert ev is not None and (ev.bs, ev.elapsed_s, ev.mem_usage_gb, ev.avail_mem_gb) == ((8,), 3.0, 2.0, 1.0)


def test_tqdm_progress_lines_are_not_capture_events():
    parsed = journal.parse(["[2026-05-30 00:21:00 TP0] Capturing batches (bs=32 avail_mem=16.80 GB):  12%|#  | 1/8"
                            "\rCapturing batches (bs=1 avail_mem=14.10 GB): 100%|##########| 8/8"])
    assert parsed.capture_events == [] and parsed.captures == []


def test_interleaved_ranks_pair_by_rank():
    lines = [begin("target verify", 17, "TP0"), begin("target verify", 17, "TP1"),
             end("target verify", (1, 2), "TP1", elapsed=10.0),
             begin("draft decode", 8, "TP1"),
             end("target verify", (1, 2, 4), "TP0", elapsed=20.0),
             end("draft decode", (1,), "TP1", elapsed=1.0)]
    parsed = journal.parse(lines)
    by = {(c.rank, c.kind): c for c in parsed.captures}
    assert by[("TP0", "target verify")].elapsed_s == 20.0 and by[("TP0", "target verify")].bs == (1, 2, 4)
    assert by[("TP1", "target verify")].elapsed_s == 10.0
    assert by[("TP1", "draft decode")].elapsed_s == 1.0
    assert all(c.complete for c in parsed.captures)


def test_begin_without_end_stays_incomplete():
    parsed = journal.parse([begin("target verify", 17, "TP0"), begin("target verify", 17, "TP5"),
                            end("target verify", rank="TP0")])
    open_ = [c for c in parsed.captures if not c.complete]
    assert [c.rank for c in open_] == ["TP5"]


# --------------------------------------------------------------------------- prefixes


@pytest.mark.parametrize("prefix, rank, tp", [
    ("[2026-05-30 00:27:32 TP3] ", "TP3", 3),
    ("[2026-05-30 00:27:32.123 TP3] ", "TP3", 3),
    ("[2026-05-30 00:27:32 DP0 TP1 EP1] ", "DP0 TP1 EP1", 1),
    ("[2026-05-30 00:27:32 DP1 PP0 TP6 EP6] ", "DP1 PP0 TP6 EP6", 6),
    ("[2026-05-30 00:27:32] ", "", None),
    ("(SchedulerActor pid=4242) [2026-05-30 00:27:32 TP2] ", "TP2", 2),
])
def test_sglang_rank_prefixes(prefix, rank, tp):
    parsed = journal.parse([prefix + "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=17, "
                            "avail mem=16.88 GB"])
    cap = only_capture(parsed)
    assert (cap.rank, cap.tp_rank, cap.num_tokens_per_req) == (rank, tp, 17)


@pytest.mark.parametrize("journald", [
    "May 30 00:27:32 dflash-train python[113022]: ",
    "May 30 00:27:32.123456 dflash-train python[113022]: ",
    "2026-05-30T00:27:32+0000 dflash-train python[113022]: ",
    "2026-05-30T00:27:32.123456+00:00 dflash-train python3.11[113022]: ",
])
def test_journald_text_prefixes(journald):
    parsed = journal.parse(journald + decode_line(2.0, 0.5, rank="TP0", t="00:27:32"))
    (dec,) = parsed.decodes
    assert dec.line.pid == 113022 and dec.line.rank == "TP0" and dec.line.timestamp.minute == 27
    assert dec.accept_len == 2.0


def test_journalctl_markers_and_blank_lines_are_skipped():
    parsed = journal.parse("-- Boot 3f1c9e0d2b7a4c58a1e6d0b4c2f8a7e1 --\n\n-- No entries --\n")
    assert parsed.lines == []


# --------------------------------------------------------------------------- decode and ready lines


def test_site_sample_decode_lines():
    parsed = journal.parse(SITE_LINES)
    assert [(d.accept_len, d.accept_rate) for d in parsed.decodes] == [(1.51, 0.07), (1.65, 0.09)]
    first = parsed.decodes[0]
    assert (first.running_reqs, first.num_tokens, first.token_usage, first.cuda_graph, first.gen_throughput,
            first.queue_reqs) == (7, 3971, 0.04, True, 74.65, 0)
    assert first.line.pid == 113022 and first.rank == "TP0"


def test_decode_line_extra_fields_and_hybrid_tokens():
    line = ("[2026-05-30 00:27:32 TP0] Decode batch [4120], #running-req: 12, #full token: 5120, full token usage: 0.05, "
            "#swa token: 900, swa token usage: 0.02, accept len: 3.10, accept rate: 0.13, cap len: 3.40, "
            "block accept len: 2.90, cuda graph: False, gen throughput (token/s): 512.00, #queue-req: 3")
    (dec,) = journal.parse([line]).decodes
    assert dec.num_tokens == 5120 and dec.token_usage == 0.05 and dec.cuda_graph is False
    assert dec.fields["cap len"] == "3.40" and dec.fields["block accept len"] == "2.90"
    assert (dec.accept_len, dec.accept_rate, dec.queue_reqs) == (3.1, 0.13, 3)


def test_autoregressive_decode_line_has_no_accept_fields():
    (dec,) = journal.parse([decode_line(None, None)]).decodes
    assert dec.accept_len is None and dec.accept_rate is None and dec.cuda_graph is True


def test_older_decode_line_spelling():
    line = ("[2025-01-10 10:00:00 TP0] Decode batch. #running-req: 1, #token: 20, token usage: 0.00, "
            "accept len: 2.31, gen throughput (token/s): 5.23, #queue-req: 0")
    (dec,) = journal.parse([line]).decodes
    assert dec.running_reqs == 1 and dec.accept_len == 2.31 and dec.accept_rate is None and dec.cuda_graph is None


def test_ready_line():
    parsed = journal.parse(["[2026-05-30 00:21:50] The server is fired up and ready to roll!"])
    assert len(parsed.ready) == 1 and parsed.ready[0].timestamp.second == 50


# --------------------------------------------------------------------------- failures


def test_capture_failure_traceback_and_oom_on_the_failing_rank():
    parsed = journal.load_file(DATA / "ddtree_b16_capture_oom_restart.journal.txt")
    kinds = [f.kind for f in parsed.failures]
    assert "capture_failed" in kinds and "cuda_oom" in kinds and "traceback" in kinds
    failed = next(f for f in parsed.failures if f.kind == "capture_failed")
    assert failed.line.rank == "TP3"  # the exception line has no prefix: it inherits the traceback's rank
    (tb,) = [f for f in parsed.failures if f.kind == "traceback"]  # the chained traceback is one failure
    assert tb.line.rank == "TP3" and tb.summary.startswith("Exception: Capture cuda graph failed: CUDA out of memory")


def test_bare_capture_failed_line():
    parsed = journal.parse(["[2026-05-30 00:21:00 TP0] Capture cuda graph failed: Capture cuda graph failed: boom"])
    assert [f.kind for f in parsed.failures] == ["capture_failed"]


@pytest.mark.parametrize("line", [
    "[2026-05-30 00:30:00 TP0] Decode out of memory happened. #retracted_reqs: 2, #new_token_ratio: 0.3000 -> 0.6000",
    "[2026-05-30 00:30:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 2, #aborted_retracted_reqs: 0",
])
def test_kv_retraction_is_not_a_failure(line):
    parsed = journal.parse([line])
    assert parsed.failures == [] and len(parsed.retractions) == 1


def test_kv_allocation_error_is_a_failure():
    parsed = journal.parse(["[2026-05-30 00:30:00 TP0] Decode out of memory. Try to lower your batch size."])
    assert [f.kind for f in parsed.failures] == ["kv_alloc_failed"]


# --------------------------------------------------------------------------- restarts


def test_pid_change_and_systemd_events_mark_a_restart():
    parsed = journal.load_file(DATA / "ddtree_b16_capture_oom_restart.journal.txt")
    assert [s.pid for s in parsed.process_starts] == [120400, 120977] and parsed.restarts == 1
    kinds = [e.kind for e in parsed.unit_events]
    assert kinds[0] == "started" and "exited" in kinds and "restart_scheduled" in kinds
    assert all(c.process in (0, 1) for c in parsed.captures)
    assert {c.process for c in parsed.captures_of()} == {1}


def test_with_unit_output_names_systemd_init_scope():
    parsed = journal.parse("May 30 00:20:01 h init.scope[1]: Started sglang-k26.service - SGLang.\n")
    assert [e.kind for e in parsed.unit_events] == ["started"]


def test_raw_output_restart_seen_from_second_server_args_line():
    text = ("[2026-05-30 00:20:05] server_args=ServerArgs(model_path='m')\n"
            + begin("target verify", 17) + "\n"
            + "[2026-05-30 00:25:05] server_args=ServerArgs(model_path='m')\n")
    parsed = journal.parse(text)
    assert parsed.restarts == 1


def test_since_start_drops_the_previous_process_stopping():
    text = ("May 30 00:19:58 h python[100]: [2026-05-30 00:19:58] Received sigquit from a child process. It usually means the child failed.\n"
            "May 30 00:19:59 h systemd[1]: Stopped sglang-k26.service - SGLang.\n"
            "May 30 00:20:01 h systemd[1]: Started sglang-k26.service - SGLang.\n"
            f"May 30 00:21:00 h python[200]: {begin('target verify', 17)}\n")
    parsed = journal.parse(text)
    assert parsed.restarts == 1
    cut = journal.since_start(parsed)
    assert cut.restarts == 0 and cut.failures == [] and len(cut.captures) == 1


# --------------------------------------------------------------------------- JSON export and I/O


def test_json_export_matches_text(tmp_path):
    from_text = journal.load_file(DATA / "ddtree_b16_healthy.journal.txt")
    from_json = journal.load_file(DATA / "ddtree_b16_healthy.json")
    assert len(from_json.captures) == len(from_text.captures) == 16
    assert [d.accept_len for d in from_json.decodes] == [d.accept_len for d in from_text.decodes]
    assert from_json.captures[0].begin.line.invocation_id
    assert [e.kind for e in from_json.unit_events] == ["started"]


def test_json_pretty_array_and_byte_array_message(tmp_path):
    msg = begin("target verify", 17, "TP0")
    entries = [{"MESSAGE": list(msg.encode()), "_PID": "7", "__REALTIME_TIMESTAMP": "1780100460000000"},
               {"MESSAGE": "first\n" + end("target verify", rank="TP0"), "_PID": "7"}]
    path = tmp_path / "j.json"
    path.write_text(json.dumps(entries, indent=2))
    cap = only_capture(journal.load_file(path))
    assert cap.complete and cap.num_tokens_per_req == 17 and cap.begin.line.timestamp.year == 2026


def test_broken_json_export_is_a_config_error(tmp_path):
    path = tmp_path / "j.json"
    path.write_text('{"MESSAGE": "x", \n')
    with pytest.raises(ConfigError, match="does not parse"):
        journal.load_file(path)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        journal.load_file(tmp_path / "nope.txt")


class FakeConnection:
    name = "fake"

    def __init__(self, result: Result):
        self.result, self.commands = result, []

    def run(self, command, *, check=True, timeout=None, stdin=None):
        self.commands.append((command, check, timeout))
        return self.result


def test_journal_window_runs_journalctl_json_and_parses():
    out = "\n".join(json.dumps({"MESSAGE": m, "_PID": "9"}) for m in [begin("target verify", 17), end("target verify")])
    conn = FakeConnection(Result("journalctl", 0, out + "\n", "", 0.1, "lab"))
    entries = facts.get(conn, facts.JournalWindow("sglang-k26.service", "2026-05-30 00:20:00"))
    assert conn.commands[0][0].startswith("journalctl -u sglang-k26.service -o json --all --since '2026-05-30 00:20:00' "
                                          "--no-pager")
    assert only_capture(journal.parse(entries)).complete


def test_journal_window_failure_is_a_host_error():
    conn = FakeConnection(Result("journalctl", 1, "", "Failed to add filter for units: No data available", 0.1, "lab"))
    with pytest.raises(HostError, match="journalctl for u.service failed on lab"):
        facts.get(conn, facts.JournalWindow("u.service", "today"))


def test_journal_window_accepts_epoch_seconds():
    conn = FakeConnection(Result("journalctl", 0, "", "", 0.1, "lab"))
    assert facts.get(conn, facts.JournalWindow("u.service", 1780100400)) == []
    assert "--since @1780100400 " in conn.commands[0][0]
