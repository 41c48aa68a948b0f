"""README.md and docs/ say true things about where to look (issue #53): every relative link in
them resolves to a file or directory inside this repository (a user who clones it has nothing
else), its #anchor names a heading of the target, and no path in backticks leads out of the
repository (README named `../shared/reference/context.md`, a folder only the project's own
machine has)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
SPAN = re.compile(r"`([^`\n]+)`")


def _prose(text: str) -> str:
    """TEXT without its fenced code blocks (a host's layout, a shell session: not links)."""
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    h = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(path: Path) -> list[str]:
    text = _prose(path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)    # a link written in backticks is an example, not a link
    return LINK.findall(text) + REF.findall(text)


def test_the_docs_are_found():
    names = {p.relative_to(REPO).as_posix() for p in DOCS}
    assert {"README.md", "docs/ARCHITECTURE.md", "docs/ci.md", "docs/lab.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves_inside_the_repository(doc):
    bad = []
    for target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):     # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if path and (REPO not in dest.parents and dest != REPO):
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(REPO)}")
    assert not bad, f"{doc.relative_to(REPO)}: " + "; ".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_path_in_backticks_leads_out_of_the_repository(doc):
    bad = []
    for span in SPAN.findall(_prose(doc.read_text())):
        if span.startswith("../"):
            dest = (doc.parent / span.split()[0]).resolve()
            if REPO not in dest.parents:
                bad.append(span)
    assert not bad, f"{doc.relative_to(REPO)} names paths outside the repository: {bad}"


def test_the_checker_sees_what_it_must():
    # the checker itself: a link out of the repository, a missing file and a missing anchor are caught
    assert slug("What a deploy does") == "what-a-deploy-does"
    assert slug("The `serial` rule, and why") == "the-serial-rule-and-why"
    assert links_in("see [the map](docs/ARCHITECTURE.md#the-map) and ![img](docs/report/x.png)") == \
        ["docs/ARCHITECTURE.md#the-map", "docs/report/x.png"]
    assert links_in("```\n[not a link](nowhere.md)\n```\n`[nor this](x.md)`") == []
    assert "the-map" in anchors(REPO / "docs/ARCHITECTURE.md")


def links_in(text: str) -> list[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as f:
        f.write(text)
    try:
        return links(Path(f.name))
    finally:
        Path(f.name).unlink()


TOPS = ("docs/", "tests/", "benchmarks/", "opsctl/", "scripts/", "playbooks/", "inventories/", "runtime/",
        "templates/")
# named in docs/ARCHITECTURE.md as the modules that are gone ("there is no opsctl/validate.py ...")
GONE = {"opsctl/validate.py", "opsctl/bench/"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_repository_path_in_backticks_exists(doc):
    # cheap drift catcher: `benchmarks/x.py`, `tests/deploy/y.py`, `opsctl/flow/z.py::f` must be there
    bad = []
    for span in SPAN.findall(_prose(doc.read_text())):
        word = span.split()[0].rstrip(":,.;")
        if word.startswith(TOPS) and not any(c in word for c in "<>*{}$|") and word not in GONE:
            if not (REPO / word.split("::")[0]).exists():
                bad.append(span)
    assert not bad, f"{doc.relative_to(REPO)} names paths this repository lacks: {bad}"


def test_the_architecture_map_names_every_module():
    # issue #53: the map lacked drain.py and startup.py; a new module goes in it with its line
    doc = (REPO / "docs/ARCHITECTURE.md").read_text()
    block = doc[doc.index("## The map"):doc.index("The layers are contracts")]
    words = set(re.findall(r"[\w.]+\.py|\w+/", block))
    src = REPO / "opsctl"
    missing = [p.relative_to(REPO).as_posix() for p in sorted(src.rglob("*.py"))
               if "emulator" not in p.relative_to(src).parts and p.name != "__init__.py" and p.name not in words]
    missing += [p.relative_to(REPO).as_posix() + "/" for p in sorted(src.iterdir())
                if p.is_dir() and p.name != "__pycache__" and f"{p.name}/" not in words]
    assert not missing, f"docs/ARCHITECTURE.md's map does not name: {missing}"


def test_the_readme_benchmarks_table_lists_every_benchmark():
    # issue #53: switch_gap.py and workload_client_overhead.py were missing from it
    text = (REPO / "README.md").read_text()
    table = text[text.index("## Benchmarks"):]
    table = table[:table.index("\n\n", table.index("| script |"))]
    rows = set(re.findall(r"^\| `(benchmarks/[\w.]+\.py)` \|", table, re.M))
    scripts = {p.relative_to(REPO).as_posix() for p in (REPO / "benchmarks").glob("*.py")}
    assert scripts - rows == set(), f"README's benchmarks table lacks {sorted(scripts - rows)}"
    assert rows - scripts == set(), f"README's benchmarks table names scripts that are gone: {sorted(rows - scripts)}"


def test_the_host_layout_names_the_baseline_files_as_the_code_writes_them():
    # issue #53: ARCHITECTURE said baselines/<model>/<profile>.json; gate/baseline.py writes two files
    from opsctl.config import load_inventory
    from opsctl.gate.baseline import baseline_paths, mix_slug

    host = load_inventory(REPO / "inventories/lab").hosts["lab"]
    run, canary = baseline_paths(host, "ar-tp8")
    root, model, mix = f"{host.install_root}/", host.model.name, mix_slug(host.gate_policy())
    doc = (REPO / "docs/ARCHITECTURE.md").read_text()
    for path in (run, canary):
        assert path.startswith(root)
        generic = path[len(root):].replace(model, "<model>").replace("ar-tp8", "<profile>").replace(mix, "<mix>")
        assert re.search(rf"^\s+{re.escape(generic)}\s", doc, re.M), generic
