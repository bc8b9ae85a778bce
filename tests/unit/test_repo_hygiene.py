"""The repo stands on its own: nothing points outside it, and what the README tour uses exists.

A newcomer reads a fresh clone. A reference to a sibling directory of the checkout, a link
into docs/ whose heading was renamed, or a tour step naming a job file that was never
committed each sends them nowhere; these tests fail on the first of each. Every helper is
also fed a sample it must flag, so none passes by finding nothing to look at.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

from drover.scheduler.validate import validate_job
from drover.server.jobspec import parse_jobspec

REPO: Final = Path(__file__).resolve().parents[2]
# Built from parts so this file does not mention what it forbids.
_SIBLING: Final = ".." + "/shared"
OUTSIDE_REFERENCES: Final = re.compile(
    "|".join(
        re.escape(s)
        for s in (_SIBLING, "shared" + "/seeds", "shared" + "/design.md", "shared" + "/reference")
    )
)
GENERATED: Final = re.compile(r"_pb2(_grpc)?\.pyi?$")
# Not the repo's own files: tools' caches and build output a checkout may hold.
_UNTRACKED_DIRS: Final = frozenset(
    {".git", ".venv", "build", "dist", ".cluster", "__pycache__", ".mypy_cache", ".ruff_cache"}
)
TEXT_SUFFIXES: Final = frozenset(
    {".py", ".pyi", ".md", ".txt", ".toml", ".cfg", ".ini", ".hcl", ".yaml", ".yml", ".json", ".sh", ".proto"}
)
TEXT_NAMES: Final = frozenset({"Makefile", "run", ".gitignore"})

# A path the tour names: relative, under a folder of the repo, with an extension. Paths
# under .cluster/ are made by `make cluster` at run time, so they are not looked for.
TOUR_PATH: Final = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w.-]+\.(?:hcl|py|md|json|yaml|yml|sh|toml))\b")
RUNTIME_PREFIXES: Final = (".cluster/", "bench-results/")
# A link into a Markdown file's heading: docs/design.md#invariant-1, ../docs/x.md#y, x.md#y.
DOC_LINK: Final = re.compile(r"((?:\.\./)*(?:[\w-]+/)*[\w-]+\.md)#([\w-]+)")
SAME_FILE_LINK: Final = re.compile(r"\]\(#([\w-]+)\)")
HEADING: Final = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


# A path in backticks, in prose: `server/raft/append.py`, `deploy/jobs/`.
PROSE_PATH: Final = re.compile(r"`((?:[\w.-]+/)+[\w.-]*)`")
# The prose that describes the repo to a newcomer; its paths must not go stale.
GUIDES: Final = ("README.md", "deploy/README.md", "deploy/RUNBOOK.md", "docs/*.md")


# --- helpers ------------------------------------------------------------------------------


def repo_files() -> list[Path]:
    """The repo's own text files: git's tracked files, or (no git) the tree minus tool output."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=30
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [
            str(p.relative_to(REPO))
            for p in REPO.rglob("*")
            if p.is_file() and not _UNTRACKED_DIRS & set(p.relative_to(REPO).parts)
        ]
    paths = [REPO / n for n in sorted(names)]
    return [p for p in paths if p.is_file() and _is_text(p) and not GENERATED.search(p.name)]


def _is_text(path: Path) -> bool:
    return path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES


def outside_references(text: str) -> list[str]:
    """Each line of ``text`` that points outside the repo, numbered from 1."""
    return [
        f"{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if OUTSIDE_REFERENCES.search(line)
    ]


def tour_section(readme: str) -> str:
    """The README's tour: from its heading to the next second-level heading."""
    start = readme.index("## A five-minute tour")
    end = readme.find("\n## ", start + 1)
    return readme[start : end if end != -1 else None]


def tour_paths(tour: str) -> list[str]:
    """Every repo path the tour's commands and text name, in order, without duplicates."""
    seen: dict[str, None] = {}
    for match in TOUR_PATH.finditer(tour):
        path = match.group(1)
        if not path.startswith(RUNTIME_PREFIXES):
            seen.setdefault(path, None)
    return list(seen)


def missing(paths: Iterable[str], root: Path) -> list[str]:
    return [p for p in paths if not (root / p).exists()]


def prose_paths(text: str, root: Path) -> list[str]:
    """Backticked paths in ``text`` that start with one of the repo's top-level folders.

    Anything else in backticks (a data dir's ``raft/snapshot.pb``, ``/var/lib/drover``, a
    flag) is not a path into the repo and is left alone.
    """
    top = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    seen: dict[str, None] = {}
    for match in PROSE_PATH.finditer(text):
        path = match.group(1)
        if path.split("/", 1)[0] in top and not path.startswith(RUNTIME_PREFIXES):
            seen.setdefault(path, None)
    return list(seen)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of every heading in ``markdown``; a repeated heading gets -1, -2, ..."""
    out: set[str] = set()
    counts: dict[str, int] = {}
    in_fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        match = HEADING.match(line)
        if match and not in_fence:
            base = slug(match.group(1))
            n = counts.get(base, 0)
            counts[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def doc_links(path: Path, text: str) -> Iterator[tuple[Path, str]]:
    """(target file, anchor) for every heading link in ``text``, which lives at ``path``.

    ``docs/...`` means the repo's docs/ from anywhere (code cites it that way); any other
    path is relative to the file, as Markdown links are.
    """
    for match in DOC_LINK.finditer(text):
        target, anchor = match.group(1), match.group(2)
        base = REPO if target.startswith("docs/") else path.parent
        yield (base / target).resolve(), anchor
    if path.suffix == ".md":
        for match in SAME_FILE_LINK.finditer(text):
            yield path.resolve(), match.group(1)


def broken_links(path: Path, text: str) -> list[str]:
    problems = []
    for target, anchor in doc_links(path, text):
        if not target.is_file():
            problems.append(
                f"{target.relative_to(REPO) if target.is_relative_to(REPO) else target}: no such file"
            )
        elif anchor not in anchors(target.read_text()):
            problems.append(f"{target.relative_to(REPO)}#{anchor}: no such heading")
    return problems


# --- the helpers flag what they must ------------------------------------------------------


def test_outside_references__flags_a_sibling_path_and_nothing_else() -> None:
    sample = f"see the design\n(`{_SIBLING}/design.md`)\ndocs/design.md is ours\n"
    assert outside_references(sample) == [f"2: (`{_SIBLING}/design.md`)"]


def test_tour_paths__finds_job_files_and_scripts_but_not_runtime_paths() -> None:
    tour = (
        "## A five-minute tour\n```sh\ndrover job run deploy/jobs/nightly.hcl\n"
        "python deploy/cluster.py kill-leader\ndrover operator raft logs -data-dir .cluster/s1\n"
        "drover operator snapshot inspect .cluster/tour.snap\n```\n## Next\ndeploy/other.hcl\n"
    )
    assert tour_paths(tour_section(tour)) == ["deploy/jobs/nightly.hcl", "deploy/cluster.py"]
    assert missing(["deploy/cluster.py", "deploy/jobs/never-committed.hcl"], REPO) == [
        "deploy/jobs/never-committed.hcl"
    ]


def test_prose_paths__only_paths_into_the_repo(tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    text = "`server/raft/append.py`, `server/gone.py`, `raft/snapshot.pb`, `/var/lib/drover`, `-stale`"
    assert prose_paths(text, tmp_path) == ["server/raft/append.py", "server/gone.py"]
    assert missing(prose_paths("`server/raft/append.py` `server/_gone.py`", REPO), REPO) == [
        "server/_gone.py"
    ]


def test_anchors__match_githubs_slugs() -> None:
    markdown = "# drover\n## Field report 1\n### `RateScaledInterval`\n### Defects found, and fixed\n## Field report 1\n"
    assert anchors(markdown) == {
        "drover",
        "field-report-1",
        "ratescaledinterval",
        "defects-found-and-fixed",
        "field-report-1-1",
    }


def test_broken_links__flags_a_renamed_heading_and_a_missing_file() -> None:
    text = "docs/design.md#invariant-1 docs/design.md#invariant-99 docs/nowhere.md#x"
    assert broken_links(REPO / "server" / "x.py", text) == [
        "docs/design.md#invariant-99: no such heading",
        "docs/nowhere.md: no such file",
    ]


# --- the repo -----------------------------------------------------------------------------


def test_repo__no_file_points_outside_the_repo() -> None:
    files = repo_files()
    assert any(p.name == "README.md" for p in files), "found no files to check"
    problems = [
        f"{p.relative_to(REPO)}:{line}"
        for p in files
        if p != Path(__file__).resolve()
        for line in outside_references(p.read_text(errors="replace"))
    ]
    assert not problems, "references that leave the repo:\n" + "\n".join(problems)


def test_readme_tour__every_file_it_names_exists() -> None:
    paths = tour_paths(tour_section((REPO / "README.md").read_text()))
    assert "deploy/jobs/nightly.hcl" in paths and "deploy/jobs/encode.hcl" in paths, paths
    assert not missing(paths, REPO), (
        f"the README tour names files a clone does not have: {missing(paths, REPO)}"
    )


def test_deploy_jobs__every_example_job_parses_and_validates() -> None:
    jobs = sorted((REPO / "deploy" / "jobs").glob("*.hcl"))
    assert len(jobs) >= 5, jobs
    for path in jobs:
        validate_job(parse_jobspec(path.read_text(), filename=str(path.relative_to(REPO))))


def test_docs_links__every_heading_link_resolves() -> None:
    problems = [
        f"{p.relative_to(REPO)}: {problem}"
        for p in repo_files()
        if p != Path(__file__).resolve()
        for problem in broken_links(p, p.read_text(errors="replace"))
    ]
    assert not problems, "links into docs/ that lead nowhere:\n" + "\n".join(problems)


def test_guides__every_path_they_name_exists() -> None:
    guides = sorted({p for pattern in GUIDES for p in REPO.glob(pattern)})
    assert len(guides) >= 6, guides
    problems = [
        f"{guide.relative_to(REPO)}: `{path}`"
        for guide in guides
        for path in missing(prose_paths(guide.read_text(), REPO), REPO)
    ]
    assert not problems, "paths the guides name that the repo does not have:\n" + "\n".join(problems)
