"""The documents speak of the project: no word of how it was worked on, and no link to a file that is not there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# "session(s)" as a word (an ONNX inference session is spoken of otherwise), "issue 16", "issue #16"
PROCESS_WORDS = re.compile(r"\bsessions?\b|\bissues? #?\d+", re.IGNORECASE)
# [text](target) and ![alt](target); the target ends at a space (a title) or the closing bracket
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?[^)]*\)")


def relative_targets(text: str) -> list[str]:
    """Link targets that name a file of the repository: no scheme, no mail, no bare #anchor."""
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_word_of_the_working_process(doc):
    found = [
        f"{doc.name}:{n}: {line.strip()}"
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if PROCESS_WORDS.search(line)
    ]
    assert not found, "say what the project does, not how it was worked on:\n" + "\n".join(found)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_at_files_that_exist(doc):
    broken = [t for t in relative_targets(doc.read_text(encoding="utf-8")) if not (doc.parent / t).exists()]
    assert not broken, f"{doc.relative_to(REPO)} links to missing files: {broken}"


def test_the_checks_catch_what_they_are_for(tmp_path):
    assert PROCESS_WORDS.search("as the twelfth session found") and PROCESS_WORDS.search("Sessions ran")
    assert PROCESS_WORDS.search("where issue 16's targets stand") and PROCESS_WORDS.search("see Issue #3")
    assert not PROCESS_WORDS.search("the frontend's ONNX models; obsession; an issue of memory")
    text = '[a](docs/x.md#part) ![b](img.png "title") [c](https://example.org/y.md) [d](#here) [e](mailto:a@b)'
    assert relative_targets(text) == ["docs/x.md", "img.png"]
