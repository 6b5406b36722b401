"""The documents speak of the project: no word of how it was worked on, no link to a file or heading that is not
there, and a README short enough to read that links every page under docs/."""

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


README_MOST_LINES = 300


def relative_targets(text: str) -> list[str]:
    """Link targets that name a file of the repository: no scheme, no mail, no bare #anchor."""
    return [target.split("#", 1)[0] for target in anchored_targets(text) if not target.startswith("#")]


def anchored_targets(text: str) -> list[str]:
    """Every link target but those with a scheme (https:, mailto:), anchors kept: `docs/x.md#part`, `#here`."""
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings ("## 4. Voices" -> "4-voices"), code blocks left out."""
    found, fenced = set(), False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            found.add(slug)
    return found


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


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_anchors_name_headings_that_exist(doc):
    broken = []
    for target in anchored_targets(doc.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path) if path else doc
        if anchor and linked.suffix == ".md" and linked.exists():
            if anchor not in anchors(linked.read_text(encoding="utf-8")):
                broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)} links to headings that are not there: {broken}"


def test_the_readme_is_short_and_links_every_page_under_docs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MOST_LINES, "detail belongs in docs/, linked from the README"
    linked = set(relative_targets(readme))
    unlinked = [f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")) if f"docs/{p.name}" not in linked]
    assert not unlinked, f"README.md does not link {unlinked}"
    for command in ("make demo", "make test", ".venv/bin/python", "source .venv/bin/activate"):
        assert command in readme


def test_the_checks_catch_what_they_are_for(tmp_path):
    assert PROCESS_WORDS.search("as the twelfth session found") and PROCESS_WORDS.search("Sessions ran")
    assert PROCESS_WORDS.search("where issue 16's targets stand") and PROCESS_WORDS.search("see Issue #3")
    assert not PROCESS_WORDS.search("the frontend's ONNX models; obsession; an issue of memory")
    text = '[a](docs/x.md#part) ![b](img.png "title") [c](https://example.org/y.md) [d](#here) [e](mailto:a@b)'
    assert relative_targets(text) == ["docs/x.md", "img.png"]
    assert anchored_targets(text) == ["docs/x.md#part", "img.png", "#here"]
    headings = "# Title\n## 4. Voices\n## Batched synthesis: the engine (CosyVoice v1, v2, v3)\n```\n# a comment\n```"
    assert anchors(headings) == {"title", "4-voices", "batched-synthesis-the-engine-cosyvoice-v1-v2-v3"}
