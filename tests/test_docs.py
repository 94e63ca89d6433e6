"""The documentation against the repository it describes.

A fenced block whose info string names a repository file after the language,

    ```c src/ops/round_ste/round_cpu.c

is a copy of that file's text. A line holding only `...` (at any indentation)
marks lines left out: every piece between such lines must stand in the file
as it is, line for line, the pieces in the block's order. Only the fence's own
indentation (a block inside a list item) and trailing spaces are ignored.
Blocks with a language alone (legacy code, shell commands) are not copies and
are not checked.

Every repository path in single backticks (`src/shim.c`, `src/ops/*/*.cu`)
must name something that exists, unless .gitignore says it is a build output.
"""

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The porting guide first: its snippets are also checked for their count.
GUIDES = ("docs/ARCHITECTURE.md", "docs/BUILDING.md", "docs/ERRORS.md", "docs/DISTRIBUTED.md")
SNIPPET_DOCUMENTS = ("docs/PORTING.md", "README.md", *GUIDES)
PATH_DOCUMENTS = ("docs/PORTING.md", "README.md", "BENCHMARKS.md", *GUIDES)
# The porting guide quotes the repository at every step; fewer marked
# snippets than this means the markers were lost, not that the guide is short.
MIN_PORTING_SNIPPETS = 20

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
GAP = "..."


class Snippet:
    """A fenced block of `document` (opening fence on line `line`) that
    names `path` as its source."""

    def __init__(self, document, line, path, lines):
        self.document, self.line, self.path, self.lines = document, line, path, lines

    @property
    def name(self):
        return f"{self.document}:{self.line} ({self.path})"


def fenced_blocks(text, document="the document"):
    """(line number of the opening fence, info string, lines) of each fenced
    block of the markdown `text`, the fence's indentation removed from its
    lines."""
    blocks, opening = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if opening is None:
            if match:
                opening = (number, match, [])
        elif (match and match["fence"][0] == opening[1]["fence"][0]
              and len(match["fence"]) >= len(opening[1]["fence"]) and not match["info"].strip()):
            blocks.append((opening[0], opening[1]["info"].strip(), opening[2]))
            opening = None
        else:
            indent = len(opening[1]["indent"])
            assert not line[:indent].strip(), (
                f"{document}:{number}: a line indented less than its block's fence")
            opening[2].append(line[indent:])
    assert opening is None, f"{document}:{opening[0]}: a fenced block is never closed"
    return blocks


def marked_snippets(document):
    """The snippets of `document` whose info string is a language and a path."""
    snippets = []
    for line, info, lines in fenced_blocks((ROOT / document).read_text(), document):
        words = info.split()
        assert len(words) <= 2, (
            f"{document}:{line}: the info string {info!r} is more than a language and a path")
        if len(words) == 2:
            snippets.append(Snippet(document, line, words[1], lines))
    return snippets


def pieces(lines):
    """The runs of lines between `...` lines, trailing spaces and the blank
    lines at each run's ends removed; empty runs dropped."""
    runs, current = [], []
    for line in [*lines, GAP]:
        if line.strip() == GAP:
            while current and not current[-1]:
                current.pop()
            while current and not current[0]:
                current.pop(0)
            if current:
                runs.append(current)
            current = []
        else:
            current.append(line.rstrip())
    return runs


def find(piece, file_lines, start):
    """The index just past the first place at or after `start` where
    file_lines holds `piece`, or None."""
    size = len(piece)
    for index in range(start, len(file_lines) - size + 1):
        if file_lines[index:index + size] == piece:
            return index + size
    return None


def snippet_problem(lines, file_text):
    """Why the snippet `lines` is not a copy of `file_text`, or None when it is."""
    runs = pieces(lines)
    if not runs:
        return "the snippet is empty"
    file_lines = [line.rstrip() for line in file_text.splitlines()]
    start = 0
    for number, piece in enumerate(runs, 1):
        end = find(piece, file_lines, start)
        if end is None:
            where = ("after the piece before it" if find(piece, file_lines, 0) is not None
                     else "anywhere in the file")
            first = next(line for line in piece if line.strip())
            return f"piece {number} of {len(runs)} (from {first.strip()!r}) is not {where}"
        start = end
    return None


PORTING_SNIPPETS = marked_snippets("docs/PORTING.md")
SNIPPETS = PORTING_SNIPPETS + [snippet for document in SNIPPET_DOCUMENTS[1:]
                               for snippet in marked_snippets(document)]


def test_the_porting_guide_marks_its_copies():
    assert len(PORTING_SNIPPETS) >= MIN_PORTING_SNIPPETS, (
        f"docs/PORTING.md marks {len(PORTING_SNIPPETS)} snippets with their file, expected at "
        f"least {MIN_PORTING_SNIPPETS}: open each copied snippet with ```LANGUAGE PATH")


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[snippet.name for snippet in SNIPPETS])
def test_snippet_is_a_copy_of_its_file(snippet):
    path = ROOT / snippet.path
    assert path.resolve().is_relative_to(ROOT) and path.is_file(), (
        f"{snippet.name}: {snippet.path} is not a file of the repository")
    problem = snippet_problem(snippet.lines, path.read_text())
    assert problem is None, f"{snippet.name}: {problem}"


# The checker itself: it must refuse a snippet that has drifted from its file.
FILE = """int lltm_example(int dtype, int device, void* stream, int64_t count,
                 const void* input, void* output) {
  if (count == 0) return 0;

  return run(dtype, device, stream, count, input, output);
}

int lltm_other(void) { return 1; }
"""


@pytest.mark.parametrize("lines", [
    FILE.splitlines(),
    ["int lltm_example(int dtype, int device, void* stream, int64_t count,", "...",
     "  return run(dtype, device, stream, count, input, output);", "}"],
    ["  if (count == 0) return 0;   ", ""],
    ["", "...", "int lltm_other(void) { return 1; }", "..."],
], ids=["whole", "gap", "trailing-spaces", "leading-gap"])
def test_checker_accepts_a_copy(lines):
    assert snippet_problem(lines, FILE) is None


@pytest.mark.parametrize("lines, expected", [
    (["int lltm_example(int dtype, int device, void* stream, int64_t size,"], "anywhere"),
    (["  if (count == 0) return 0;", "  return run(dtype, device, stream, count, input, output);"],
     "anywhere"),
    (["    if (count == 0) return 0;"], "anywhere"),
    (["if (count == 0) return 0;"], "anywhere"),
    (["int lltm_other(void) { return 1; }", "...", "  if (count == 0) return 0;"],
     "after the piece before it"),
    (["...", "", "..."], "empty"),
], ids=["changed-word", "missing-gap", "more-indented", "less-indented", "out-of-order",
        "empty"])
def test_checker_refuses_a_drifted_snippet(lines, expected):
    problem = snippet_problem(lines, FILE)
    assert problem is not None and expected in problem, problem


@pytest.mark.parametrize("snippet", PORTING_SNIPPETS,
                         ids=[snippet.name for snippet in PORTING_SNIPPETS])
def test_checker_refuses_each_guide_snippet_changed_by_one_character(snippet):
    """Every real snippet, its longest line given one more character, no
    longer passes: no snippet is checked against text that would accept
    anything."""
    lines = list(snippet.lines)
    longest = max((index for index, line in enumerate(lines) if line.strip() != GAP),
                  key=lambda index: len(lines[index]))
    lines[longest] += ";"
    assert snippet_problem(lines, (ROOT / snippet.path).read_text()) is not None


def test_fence_parsing_keeps_list_item_blocks_and_their_info():
    text = "1. Check:\n\n   ```python lltm_ffi/ops.py\n   def forward(gates, old_cell):\n   ```\n"
    assert fenced_blocks(text) == [(3, "python lltm_ffi/ops.py", ["def forward(gates, old_cell):"])]


# Paths in backticks.
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PATH = re.compile(r"^[\w.*-]+(/[\w.*-]*)*$")


def build_outputs(root):
    """The patterns of .gitignore: paths that exist only after a build."""
    lines = (root / ".gitignore").read_text().splitlines()
    return [line.strip().lstrip("/") for line in lines if line.strip() and not line.startswith("#")]


def is_build_output(path, patterns):
    return any(fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, pattern + "*")
               or (pattern.endswith("/") and path.startswith(pattern)) for pattern in patterns)


def mentioned_paths(document, root=ROOT):
    """(line number, path) of each inline code span of `document` (outside
    fenced blocks) that is a path starting at a top-level entry of `root`,
    build outputs left out."""
    top_level = {entry.name for entry in root.iterdir() if entry.name != ".git"}
    outputs = build_outputs(root)
    text = (root / document).read_text()
    fenced = {number for start, _, lines in fenced_blocks(text, document)
              for number in range(start, start + len(lines) + 2)}
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if number in fenced:
            continue
        for span in INLINE_CODE.findall(line):
            if (PATH.match(span) and span.split("/")[0] in top_level
                    and ("/" in span or (root / span).is_file())
                    and not is_build_output(span, outputs)):
                found.append((number, span))
    return found


def path_problem(path, root=ROOT):
    """Why `path` (a glob where it has wildcards) names nothing in `root`, or None."""
    if any(character in path for character in "*?["):
        return None if any(root.glob(path)) else f"nothing matches `{path}`"
    return None if (root / path).exists() else f"`{path}` does not exist"


MENTIONS = [(document, number, path) for document in PATH_DOCUMENTS
            for number, path in mentioned_paths(document)]


def test_paths_are_found_in_each_document():
    for document in PATH_DOCUMENTS:
        assert any(mention[0] == document for mention in MENTIONS), (
            f"no repository path found in {document}: the path pattern no longer matches")


@pytest.mark.parametrize("document, number, path", MENTIONS,
                         ids=[f"{document}:{number}:{path}" for document, number, path in MENTIONS])
def test_mentioned_path_exists(document, number, path):
    problem = path_problem(path)
    assert problem is None, f"{document}:{number}: {problem}"


def test_path_check_refuses_a_missing_file(tmp_path):
    """The two functions above, on a document that names a removed file."""
    (tmp_path / ".gitignore").write_text("/build/\n*.so\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "round_cpu.c").write_text("")
    (tmp_path / "doc.md").write_text(
        "See `src/round_cpu.c`, `src/round_kernel.h` and `src/*.cu`; `int x` is code;\n"
        "`src/_module*.so` and `build/x.json` are build outputs.\n\n"
        "```c\n`src/inside_a_block.c`\n```\n")
    mentioned = mentioned_paths("doc.md", tmp_path)
    assert mentioned == [(1, "src/round_cpu.c"), (1, "src/round_kernel.h"), (1, "src/*.cu")]
    assert path_problem("src/round_cpu.c", tmp_path) is None
    assert "does not exist" in path_problem("src/round_kernel.h", tmp_path)
    assert "nothing matches" in path_problem("src/*.cu", tmp_path)


def test_the_examples_above_name_files_that_exist():
    """This file's docstring shows both kinds of mention on real files."""
    named = re.findall(r"```\w+ (\S+)", __doc__) + [
        span for span in INLINE_CODE.findall(__doc__) if "/" in span and PATH.match(span)]
    assert len(named) == 3, named
    problems = [problem for problem in map(path_problem, named) if problem]
    assert not problems, problems


def test_the_readme_stays_short():
    """The README is the first page a newcomer reads; details go to docs/."""
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines < 300, f"README.md has {lines} lines"


def test_the_readme_names_every_registered_op():
    """Every op with a self-check (lltm_ffi.op.self_check) is in the README's
    list of ops, as the function users call."""
    import lltm_ffi

    readme = (ROOT / "README.md").read_text()
    ops = readme.split("### Ops")[1].split("\n## ")[0]
    missing = [name for name in lltm_ffi.op.SELF_CHECKS if f"`lltm_ffi.{name}(" not in ops]
    assert not missing, f"README.md's Ops list does not name {missing}"
