"""SGLang's rules have one definition, opsctl/onhost/sglang_rules.py (issue #53). The DDTree
runtime (its own wheel) and the lab's emulator (runs on the lab host without opsctl) carry
generated copies; an edit to a copy, or to the source without regenerating, fails here with the
command that fixes it. What the rules say is held to SGLang 0.5.23 itself in
test_capture_list_vs_sglang.py (marked sglang)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opsctl.onhost import sglang_rules

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "opsctl" / "onhost" / "sglang_rules.py"


@pytest.mark.parametrize("copy", sglang_rules.COPIES)
def test_each_copy_is_the_source_as_generated(copy):
    want = sglang_rules.copy_text(SOURCE.read_text(encoding="utf-8"))
    got = (REPO / copy).read_text(encoding="utf-8")
    assert got == want, f"{copy} differs from opsctl/onhost/sglang_rules.py: run `python -m opsctl.onhost.sglang_rules`"


def test_the_check_mode_names_an_edited_copy(tmp_path):
    """`python -m opsctl.onhost.sglang_rules --check` (what a contributor runs) exits 1 and names
    the copy that was edited, and writes nothing."""
    (tmp_path / "opsctl" / "onhost").mkdir(parents=True)
    src = tmp_path / "opsctl" / "onhost" / "sglang_rules.py"
    src.write_text(SOURCE.read_text(encoding="utf-8"))
    for rel in sglang_rules.COPIES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text(encoding="utf-8"))
    edited = tmp_path / sglang_rules.COPIES[1]
    edited.write_text(edited.read_text().replace("range(10, 33, 2)", "range(10, 33, 4)"))
    r = subprocess.run([sys.executable, str(src), "--check"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout.strip() == f"{sglang_rules.COPIES[1]}: differs", r.stdout
    assert "range(10, 33, 4)" in edited.read_text()
    r = subprocess.run([sys.executable, str(src)], capture_output=True, text=True)
    assert r.returncode == 0 and "range(10, 33, 4)" not in edited.read_text()


def test_no_other_module_writes_the_capture_list_again():
    """The list's literal steps stand in the source and its copies only."""
    needle = "range(72, 257, 8)"
    roots = [REPO / "opsctl", REPO / "runtime" / "src"]
    holders = sorted(str(p.relative_to(REPO)) for root in roots for p in root.rglob("*.py")
                     if needle in p.read_text(encoding="utf-8"))
    assert holders == sorted(["opsctl/onhost/sglang_rules.py", *sglang_rules.COPIES])
