"""`python -m lltm_ffi new-op NAME`: a new op, ready to edit, in a checkout.

Writes the op's two folders from template/ (each `@name@` in a path or a
text becomes NAME, `@Name@` its CamelCase, `@NAME@` its capitals):

    src/ops/NAME/           the kernels and their launchers (NAME_kernel.cu),
                            the CPU passes (NAME_cpu.c, NAME_cpu_impl.h), the
                            math both share (NAME_math.h), the C check that
                            `make asan` runs (test_NAME_cpu.c)
    lltm_ffi/ops/NAME/      the declaration (NAME.py: passes, autograd, the
                            nn.Module, the self-check), its public names
                            (__init__.py) and its tests (test_NAME.py)

and the op's entry in README.md's list of ops, which the suite checks
against the ops registered. Nothing else needs to know of the op: the
build finds its sources, the package imports its folder and exports its
__all__, `make asan` runs its C check. The op written is
`NAME(input, scale=1.0)`, scale times input with its gradient, float32
and float64, CPU and CUDA: it builds and passes its tests, `make asan` and
the suite as it is (tests/test_scaffold.py), so every edit from there
starts from a working op. docs/PORTING.md says what to edit.

This module imports neither torch nor the compiled module.
"""

import ast
import keyword
import re
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "template"
# The checkout this package sits in, where new-op writes.
CHECKOUT = Path(__file__).resolve().parent.parent.parent
# Where the op's entry goes: the README's list of ops, a list of "- " items.
README_OPS_HEADING = "### Ops"
# The passes the op written declares, by their suffix.
PASS_SUFFIXES = ("_forward", "_backward")
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
MAX_NAME_LENGTH = 40
_REGISTERED_PASS = re.compile(r"\bLLTM_(?:CPU|CUDA)_PASS\w*\(\s*(\w+)")
_DECLARED_PASS = re.compile(r"\bc_pass\(\s*[\"'](\w+)[\"']")

USAGE = """usage: python -m lltm_ffi               diagnostics and a self-check of every op
       python -m lltm_ffi new-op NAME   write a new op's folders into this checkout"""


class ScaffoldError(ValueError):
    """A name new-op refuses, or a checkout it cannot write into."""


def camel_case(name):
    """The op's module class: embed_bag -> EmbedBag."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def substitute(text, name):
    return (text.replace("@name@", name).replace("@Name@", camel_case(name))
            .replace("@NAME@", name.upper()))


def pass_names(root):
    """{pass name: the file that registers or declares it} for every pass of
    the checkout at `root`, from its sources (nothing is imported)."""
    found = {}
    for pattern, files in ((_REGISTERED_PASS, [*root.glob("src/**/*.c"),
                                               *root.glob("src/**/*.cu")]),
                           (_DECLARED_PASS, root.glob("lltm_ffi/**/*.py"))):
        for path in sorted(files):
            for name in pattern.findall(path.read_text(errors="replace")):
                found.setdefault(name, path.relative_to(root).as_posix())
    return found


def public_names(root):
    """{name: where} of what the package at `root` holds or exports: its
    modules and subpackages, and each op folder's __all__."""
    package = root / "lltm_ffi"
    names = {path.stem: path.relative_to(root).as_posix() for path in package.iterdir()
             if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists())}
    for init in sorted(package.glob("ops/*/__init__.py")):
        for node in ast.walk(ast.parse(init.read_text())):
            if (isinstance(node, ast.Assign) and any(
                    isinstance(target, ast.Name) and target.id == "__all__"
                    for target in node.targets) and isinstance(node.value, (ast.List, ast.Tuple))):
                for element in node.value.elts:
                    if isinstance(element, ast.Constant) and isinstance(element.value, str):
                        names.setdefault(element.value, init.relative_to(root).as_posix())
    for name in ("CUDA_COMPILED", "LLTMBuildError", "LLTMBuildWarning", "LLTMError"):
        names.setdefault(name, "lltm_ffi/__init__.py")
    return names


def refusal(name, root):
    """Why `name` cannot be a new op in the checkout at `root`, or None."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        return (f"{name!r} is not a lowercase identifier (a letter, then letters, digits and "
                "underscores): it names the op's function, folders, files, passes and C "
                "symbols")
    if len(name) > MAX_NAME_LENGTH:
        return f"{name!r} is longer than {MAX_NAME_LENGTH} characters"
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"{name!r} is a Python keyword"
    if name.startswith("test"):
        return f"{name!r} starts with 'test': pytest would take its module for a test file"
    for folder in (root / "src" / "ops" / name, root / "lltm_ffi" / "ops" / name):
        if folder.exists():
            return f"an op named {name!r} exists already ({folder.relative_to(root)})"
    passes = pass_names(root)
    for pass_name in (name, *(name + suffix for suffix in PASS_SUFFIXES)):
        if pass_name in passes:
            return (f"the op would declare the pass {pass_name!r}, or be named as one, but "
                    f"{passes[pass_name]} has a pass of that name already")
    taken = public_names(root)
    for public in (name, camel_case(name)):
        if public in taken:
            return (f"the op would export lltm_ffi.{public}, a name {taken[public]} holds "
                    "already")
    return None


def _template_files():
    return sorted(path for path in TEMPLATE.rglob("*.in") if path.is_file())


def readme_entry(name):
    """The op's item in README.md's list of ops (the suite checks that every
    op with a self-check is named there as `lltm_ffi.NAME(`)."""
    return (f"- **{name}.** `lltm_ffi.{name}(input, scale=1.0)`: `scale` times\n"
            f"  `input`, any shape, float32 or float64, with its gradient;\n"
            f"  `lltm_ffi.{camel_case(name)}(scale=1.0)` is the module.\n")


def with_readme_entry(text, name):
    """README.md's `text` with the op's entry as the last item of its list of ops."""
    lines = text.splitlines(keepends=True)
    try:
        heading = next(index for index, line in enumerate(lines)
                       if line.strip() == README_OPS_HEADING)
        first = next(index for index in range(heading + 1, len(lines))
                     if lines[index].startswith("- "))
    except StopIteration:
        raise ScaffoldError(f"README.md has no list under {README_OPS_HEADING!r} for the op's "
                            "entry") from None
    end = first
    while end < len(lines) and (lines[end].startswith("- ") or lines[end].startswith("  ")):
        end += 1
    return "".join(lines[:end]) + readme_entry(name) + "".join(lines[end:])


def new_op(name, root=CHECKOUT):
    """Writes the op `name` into the checkout at `root`: its two folders and
    its README entry. Returns the paths written, relative to `root`; raises
    ScaffoldError, having written nothing, for a name it refuses."""
    root = Path(root)
    if not (root / "src" / "ops").is_dir() or not (root / "lltm_ffi" / "ops").is_dir():
        raise ScaffoldError(f"{root} is not an lltm_ffi checkout (it has no src/ops/ and "
                            "lltm_ffi/ops/): new-op writes into a checkout's sources")
    problem = refusal(name, root)
    if problem:
        raise ScaffoldError(f"new-op: {problem}; choose another name")
    readme = root / "README.md"
    readme_text = with_readme_entry(readme.read_text(), name)
    written = []
    for template in _template_files():
        relative = template.relative_to(TEMPLATE).with_suffix("")
        target = root / substitute(relative.as_posix(), name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(substitute(template.read_text(), name))
        written.append(target.relative_to(root).as_posix())
    readme.write_text(readme_text)
    written.append("README.md")
    return written


def main(arguments):
    """`python -m lltm_ffi new-op NAME`; returns the exit status."""
    if len(arguments) != 1 or arguments[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    name = arguments[0]
    try:
        written = new_op(name)
    except ScaffoldError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"wrote the op {name} (scale times input, with its gradient) into {CHECKOUT}:")
    for path in written:
        print(f"  {path}")
    print(f"""
It builds and passes its tests as it is:

    make CUDA=0 && make asan && python3 -m pytest -q lltm_ffi/ops/{name}

then make it yours: the kernels in src/ops/{name}/, the declaration and tests
in lltm_ffi/ops/{name}/, its entry in README.md (docs/PORTING.md walks a port).""")
    return 0
