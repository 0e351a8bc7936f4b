"""The README is a product page (issues 49 and 84): short, no run history (commit hashes), the
two commands a newcomer runs first, and every link from it and the docs reaches a file and, where
it names one, a heading. Its figures come from records (tests/benchmarks/test_records.py)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "docs" / "results" / "README.md"]


def test_readme_is_short_and_names_no_commit():
    assert len(README.splitlines()) <= 200
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", README) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not hashes, hashes


PROSE_WIDTH, ROW_WIDTH = 120, 240
"""The README's widest lines (issue 101: it sat at its line cap and grew sideways, one line 733
characters, a prose line 295). Prose wraps, so it is held to 120, the width the rest of it is
written at; a hand-written table row cannot wrap, so it is held to 240 (today's widest: 230) and a
cell that needs more belongs in the page it links. Code blocks are left out (a command is kept
whole, so that it runs as written) and so are generated blocks (their width is the records'
figures, at most five rows: tests/benchmarks/test_records.py)."""


def written_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the text people write: outside ``` blocks and generated blocks."""
    out, fenced, generated = [], False, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("<!-- records:begin"):
            generated = True
        elif line.startswith("<!-- records:end"):
            generated = False
        elif not fenced and not generated:
            out.append((number, line))
    return out


def test_readme_does_not_grow_sideways():
    too_wide = [(n, len(line)) for n, line in written_lines(README)
                if len(line) > (ROW_WIDTH if line.startswith("|") else PROSE_WIDTH)]
    assert not too_wide, f"README (line, characters) over {PROSE_WIDTH} (prose) or {ROW_WIDTH} (rows): {too_wide}"


def test_written_lines_leave_out_code_and_generated_blocks():
    text = "a\n```bash\nlong command\n```\n<!-- records:begin x -->\n| row |\n<!-- records:end x -->\nb\n"
    assert written_lines(text) == [(1, "a"), (8, "b")]


def test_readme_starts_with_the_two_commands_and_they_exist():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in block.splitlines()] == [["make", "demo"], ["make", "test"]]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for title in re.findall(r"^#+\s+(.*)$", page.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_link_of_the_readme_and_docs_reaches_its_file_and_heading():
    """Run narratives left the docs (docs/history.md is gone): a link to a removed page or anchor fails."""
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.relative_to(ROOT)}: {target}"
            if anchor and dest.suffix == ".md":
                assert anchor in anchors(dest), f"{page.relative_to(ROOT)}: {target}"
    assert not (ROOT / "docs" / "history.md").exists()
    assert "history.md" not in README
