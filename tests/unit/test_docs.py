"""The documentation agrees with itself: every relative link lands on a file and heading that
exist, and the README's search time is one measured figure, with its date, kept in
docs/measured.md, which the README and the shipped file it runs cite alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces
    to hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_lands_on_a_file_and_heading(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(REPO)}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert broken == []


def test_no_page_cites_a_section_by_name_instead_of_a_link():
    """A section named in prose (README "Measured") dangles once it is renamed or moved."""
    cited = [
        f"{page.name}: {m.group(0)}"
        for page in PAGES
        for m in re.finditer(r'README "[^"]+"', page.read_text())
    ]
    assert cited == []


def readme_search_time() -> tuple[str, str, str]:
    """docs/measured.md's figure for the README's search: minutes of search, minutes with
    the install, and the date it was measured."""
    text = (REPO / "docs" / "measured.md").read_text()
    section = text.split("## The README's search", 1)[1].split("\n## ", 1)[0]
    found = re.search(
        r"\*\*(\d+\.\d) min\*\* of search, (\d+\.\d) min with the install.*?(\d{4}-\d\d-\d\d)",
        section,
        re.S,
    )
    assert found, "docs/measured.md: the README's search has no measured figure"
    return found.groups()


def test_the_readme_and_dept_yaml_cite_the_one_measured_search_time():
    search, install, date = readme_search_time()
    readme = (REPO / "README.md").read_text()
    assert f"in {search} min" in readme  # the console excerpt: that run's own line
    assert f"{search} min of search" in readme and f"{install} min" in readme and date in readme
    assert "docs/measured.md#the-readmes-search" in readme
    header = (REPO / "search_spaces" / "dept.yaml").read_text().split("\nname:", 1)[0]
    assert f"{search} min" in header and date in header and "docs/measured.md" in header
    assert not re.search(r"~\s*\d+ min", readme + header)  # no estimate beside the figure


BENCHMARK_COMMAND = re.compile(r"python\s+-m\s+(benchmarks(?:\.\w+)+)\b(?!\.<)")  # not .<study>


def test_every_benchmark_command_names_a_module_that_exists():
    """``python -m benchmarks.<folder>.<study>`` in the docs, the READMEs, the scripts and the
    studies' own usage lines names a module (or package with ``__main__``) there is."""
    sources = [*PAGES, REPO / "benchmarks" / "README.md", *sorted((REPO / "scripts").glob("*.sh")),
               *sorted((REPO / "benchmarks").rglob("*.py"))]  # fmt: skip
    missing = set()
    for source in sources:
        for name in BENCHMARK_COMMAND.findall(source.read_text()):
            path = REPO / name.replace(".", "/")
            if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
                missing.add(f"{source.relative_to(REPO)}: {name}")
    assert sorted(missing) == []
