"""The README is a product page (issue 49): short, and run history (commit hashes) lives in
docs/history.md. Its first commands are the two a newcomer runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_is_short_and_names_no_commit():
    assert len(README.splitlines()) <= 250
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", README) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not hashes, hashes


def test_readme_starts_with_the_two_commands_and_they_exist():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in block.splitlines()] == [["make", "demo"], ["make", "test"]]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_every_doc_the_readme_links_exists():
    for target in re.findall(r"\]\(((?:docs/|CONTRIBUTING)[^)#]*)", README):
        assert (ROOT / target).exists(), target
