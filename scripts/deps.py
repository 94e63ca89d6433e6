"""`make deps` (and `make test`, `make demo`): installs, with this Python's
pip, what the requirement files ask for and this Python lacks, says what it
installs, and installs nothing (so needs no network) when all is present.

    python scripts/deps.py --torch 2.13.0 requirements.txt [requirements-demo.txt]

torch is the exception: a missing or too old torch is replaced by exactly
torch==<--torch>, the version tested, never by whatever the index has newest.
Which build pip picks for it is pip's choice: on Linux x86-64 PyPI serves
the CUDA build (see docs/BUILDING.md); a torch installed
beforehand, such as the CPU-only build, is kept.

The requirement files hold one `name`, `name>=version` or `name==version`
a line (with `#` comments): that is all this script reads, with the
standard library only, since it runs before anything is installed. A pinned
package installed at another version is replaced by the pinned one.
"""

import argparse
import importlib.metadata
import re
import subprocess
import sys

LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:(>=|==)\s*([0-9][0-9.]*))?$")


def release(version):
    """(2, 13, 0) for '2.13.0+cpu' or '2.13.0rc1': the numeric release only."""
    return tuple(int(part) for part in re.findall(r"\d+", re.match(r"[\d.]*", version).group()))


def read_requirements(path):
    requirements = []
    for number, line in enumerate(open(path), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = LINE.match(line)
        if not match:
            sys.exit(f"{path}:{number}: deps.py reads only `name`, `name>=version` or "
                     f"`name==version`, not {line!r}")
        name, operator, version = match.groups()
        requirements.append((name, operator, version, line))
    return requirements


def unmet(name, operator, version):
    """Why `name` (`operator` ">=" or "==" `version`, or any version where
    operator is None) is not satisfied here, or None."""
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
    if operator == ">=" and release(installed) < release(version):
        return f"{installed} installed"
    if operator == "==" and release(installed) != release(version):
        return f"{installed} installed"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", required=True, help="the torch version to install if needed")
    parser.add_argument("files", nargs="+", help="requirement files")
    args = parser.parse_args(argv)

    install = []
    for path in args.files:
        for name, operator, version, line in read_requirements(path):
            reason = unmet(name, operator, version)
            if reason is None:
                continue
            wanted = f"torch=={args.torch}" if name.lower() == "torch" else line
            if wanted not in install:
                print(f"deps: {line}: {reason}; installing {wanted}", flush=True)
                install.append(wanted)
    if not install:
        return 0
    command = [sys.executable, "-m", "pip", "install", *install]
    print("deps:", " ".join(command), flush=True)
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
