"""Counts an op's lines of glue, as docs/PORTING.md ("The count") defines them:

    python3 scripts/count_glue.py embed

Glue is every line of code (not blank, not a comment, not a docstring) of
the op's two folders that is none of: the kernels and the CPU loops (the
math), the Caffe-style launchers, the tests. So it counts:

- Python, lltm_ffi/ops/NAME/*.py but the test files: every line of code,
  but the self-check's (the function under @op.self_check), a test that
  `python -m lltm_ffi` runs, which is reported apart;
- C and CUDA, src/ops/NAME/* but the C check (test_*.c): the preprocessor
  lines and the LLTM_..._PASS lines that connect a launcher or a CPU pass to
  the shim; the rest of those files is kernels, loops and launchers;
- outside the folders, the lines of the op's entry in README.md's list of
  ops (from its `- **NAME.**` line to the next entry), the one thing the
  suite asks for there: prose, as docstrings are, so listed apart.
"""

import ast
import io
import pathlib
import re
import sys
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_lines(path):
    """(glue, self_check): the numbers of lines of code of one Python file,
    outside and inside the functions registered with @op.self_check."""
    text = path.read_text()
    code = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                              tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(range(token.start[0], token.end[0] + 1))
    docstrings, self_check = set(), set()
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            docstrings.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, ast.FunctionDef) and any(
                "self_check" in ast.unparse(decorator) for decorator in node.decorator_list):
            first = min(decorator.lineno for decorator in node.decorator_list)
            self_check.update(range(first, node.end_lineno + 1))
    code -= docstrings
    return len(code - self_check), len(code & self_check)


def c_lines(path):
    """The preprocessor lines and LLTM_..._PASS lines of one C or CUDA file."""
    count, depth, directive = 0, 0, False
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if directive or depth:
            count += 1
        elif stripped.startswith("#") or re.match(r"LLTM_\w*PASS\w*\(", stripped):
            count += 1
            directive = stripped.startswith("#")
        else:
            continue
        if directive:
            directive = stripped.endswith("\\")
        else:
            depth += stripped.count("(") - stripped.count(")")
    return count


def readme_lines(name):
    """The lines of the op's entry in README.md's list of ops."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(f"- **{name}.**"))
    end = start + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return end - start


def main(name):
    rows = []
    for path in sorted((ROOT / "lltm_ffi" / "ops" / name).glob("*.py")):
        if not path.name.startswith(("test_", "conftest")):
            glue, self_check = python_lines(path)
            rows.append((path, glue))
            if self_check:
                print(f"{'(self-check, counted with the tests)':<45} {self_check:>4}")
    for path in sorted((ROOT / "src" / "ops" / name).iterdir()):
        if not path.name.startswith("test_"):
            rows.append((path, c_lines(path)))
    for path, count in rows:
        print(f"{str(path.relative_to(ROOT)):<45} {count:>4}")
    print(f"{'glue':<45} {sum(count for _, count in rows):>4}")
    print(f"{'README.md (the op' + chr(39) + 's entry, prose)':<45} {readme_lines(name):>4}")


if __name__ == "__main__":
    main(*sys.argv[1:] or ["embed"])
