"""The check lane and the manual's samples on each supported Python besides the suite's own.

``make test`` runs the whole suite in ``.venv``; this runs, for each version named on
the command line (the Makefile's ``OTHER_PYTHONS``), ``pytest --lane=check`` and
``tests/docs/test_samples.py`` in a virtual environment of that version's own,
``.venv-<version>``, installed as ``.venv`` is and kept until ``pyproject.toml``
changes. An interpreter is a ``python<version>`` on PATH or a pyenv build of that
version (the newest, when there are several). A version with no interpreter is named
and skipped; with ``CI`` set it fails the run. Exits 1 when a lane failed, ran no
tests or an interpreter is missing under CI.

The versions run side by side, each one's output held back and printed whole when its lanes
end: the lanes mostly wait on leases and servers, so three share two cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
# What the Makefile's install step puts in .venv, in the same order (see its $(STAMP) rule).
INSTALL = (
    ["-m", "pip", "install", "--quiet", "--upgrade", "pip"],
    ["-m", "pip", "install", "--quiet", "--editable", ".", "--group", "dev", "--group", "docs"],
    ["-m", "pip", "install", "--quiet", "--no-deps", "arq>=0.26,<0.29"],
)
# The lanes run on each interpreter, and the processes each gets (as `make check` and `make docs` do).
LANES = (
    ["-m", "pytest", "-n", "3", "-q", "-p", "no:randomly", "--lane=check"],
    ["-m", "pytest", "-n", "2", "-q", "-p", "no:randomly", "tests/docs/test_samples.py"],
)


def _version_of(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def _pyenv_builds(version: str) -> list[Path]:
    roots = [os.environ.get("PYENV_ROOT")]
    if shutil.which("pyenv"):
        done = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False)
        roots.append(done.stdout.strip())
    roots.append(str(Path.home() / ".pyenv"))
    found: set[Path] = set()
    for root in filter(None, roots):
        # 3.13.0, not a free-threaded 3.13.0t: that one is a build of its own.
        found |= {p for p in Path(root, "versions").glob(f"{version}.*/bin/python") if p.parts[-3][-1].isdigit()}
    # The newest patch release first: 3.12.10 before 3.12.9.
    return sorted(found, key=lambda p: [int(x) for x in p.parts[-3].split(".")], reverse=True)


def find(version: str) -> str | None:
    """An interpreter of ``version`` ("3.12"), or ``None``."""
    candidates = [shutil.which(f"python{version}"), *map(str, _pyenv_builds(version))]
    for python in filter(None, candidates):
        if _version_of(python) == version:
            return python
    return None


def _run(args: list[str], label: str) -> int:
    print(f"== {label}: {' '.join(args)}", flush=True)
    return subprocess.run(args, cwd=ROOT, check=False).returncode


def _lanes(version: str, env_python: Path) -> tuple[list[str], str]:
    """Run the lanes on ``env_python``: the lanes that failed, and everything they printed."""
    failed: list[str] = []
    said: list[str] = []
    started = time.monotonic()
    for lane in LANES:
        args = [str(env_python), *lane]
        done = subprocess.run(args, cwd=ROOT, check=False, capture_output=True, text=True)
        said += [f"== Python {version}: {' '.join(args)}", done.stdout, done.stderr]
        if done.returncode != 0:
            # 5 is pytest's "no tests ran": a failure here too.
            failed.append(f"{version} ({' '.join(lane[2:])}: exit {done.returncode})")
    said.append(f"== Python {version}: {time.monotonic() - started:.0f} s")
    return failed, "\n".join(part.rstrip("\n") for part in said if part)


def venv(version: str, python: str) -> Path | None:
    """``.venv-<version>``, made and installed when missing or older than pyproject.toml."""
    where = ROOT / f".venv-{version}"
    stamp = where / ".installed"
    bin_python = where / "bin" / "python"
    if stamp.exists() and stamp.stat().st_mtime >= PYPROJECT.stat().st_mtime:
        return bin_python
    shutil.rmtree(where, ignore_errors=True)
    if _run([python, "-m", "venv", str(where)], f"Python {version}") != 0:
        return None
    for step in INSTALL:
        if _run([str(bin_python), *step], f"Python {version}") != 0:
            return None
    stamp.touch()
    return bin_python


def main(versions: list[str]) -> int:
    """Run the lanes on each of ``versions``; the exit status.

    The venvs are made side by side first (pip waits on downloads and disk more than on
    the CPU), then the lanes run side by side too.
    """
    in_ci = bool(os.environ.get("CI"))
    failed: list[str] = []
    found: dict[str, str] = {}
    for version in versions:
        python = find(version)
        if python is None:
            print(f"Python {version}: no python{version} on PATH and no pyenv build", flush=True)
            if in_ci:
                failed.append(f"{version} (missing)")
        else:
            found[version] = python
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, len(found))) as pool:
        made = dict(zip(found, pool.map(venv, found, found.values()), strict=True))
    print(f"== venvs for Python {', '.join(found)}: {time.monotonic() - started:.0f} s", flush=True)
    failed += [f"{version} (install)" for version, env_python in made.items() if env_python is None]
    ready = {version: env_python for version, env_python in made.items() if env_python is not None}
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, len(ready))) as pool:
        for lane_failed, said in pool.map(_lanes, ready, ready.values()):
            print(said, flush=True)
            failed += lane_failed
    print(f"== lanes on Python {', '.join(ready)}: {time.monotonic() - started:.0f} s", flush=True)
    if failed:
        print("failed on: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
