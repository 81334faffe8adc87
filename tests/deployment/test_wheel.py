"""The package as users get it: the sdist and the wheel built, checked and installed outside the checkout.

``python -m build`` makes both from the checkout (in an isolated build environment, as a
release does); ``twine check`` reads their metadata. The wheel is then installed into
clean virtual environments in a temporary directory, never the checkout's, and run from
there: with no extra, the tutorial's samples (they need ``[testing]``'s embedded fake and a
real server), ``goblin-claim --help`` and ``goblin-claim doctor`` against the session's
redis-server; with each extra alone, the door or client that extra is for, imported and
used. A wheel that lost a Lua script, ``py.typed`` or the entry point, or an extra that
does not bring what its door imports, fails here.

The wheels every install needs are downloaded once per run into a wheelhouse (arq's
``redis<6`` pin is resolved apart from the rest), and each environment installs from it
alone, offline.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.support import servers
from tests.support.servers import RedisProcess

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "get-started" / "tutorial.md"

# Each extra, and a program that uses what it is for: its door imported (and used where a
# server is needed to see it work), or its client making a claim on the session's server.
# PORT is the server's; every program ends by printing "ok".
USES: dict[str, str] = {
    "django": "import goblin_claim.django",
    "flask": "import goblin_claim.flask",
    "aiohttp": "import goblin_claim.aiohttp",
    "celery": "import goblin_claim.celery",
    "rq": "import goblin_claim.rq",
    "dramatiq": "import goblin_claim.dramatiq",
    "arq": "import goblin_claim.arq",
    "faststream": "import goblin_claim.faststream",
    "taskiq": "import goblin_claim.taskiq",
    "huey": "import goblin_claim.huey",
    "otel": "import goblin_claim.otel\ngoblin_claim.otel.instrument()",
    "testing": """
        from goblin_claim import Claim, Claimed
        from goblin_claim.testing import fake_redis
        assert isinstance(Claim(fake_redis(native=True), "wheel").acquire(), Claimed)
    """,
    "hiredis": """
        import redis, redis.utils
        from goblin_claim import Claim, Claimed
        assert redis.utils.HIREDIS_AVAILABLE
        assert isinstance(Claim(redis.Redis(HOST, PORT), KEY).acquire(), Claimed)
    """,
    "valkey": """
        import valkey
        from goblin_claim import Claim, Claimed
        assert isinstance(Claim(valkey.Valkey(HOST, PORT), KEY).acquire(), Claimed)
    """,
    "glide-sync": """
        import glide_sync
        from goblin_claim import Claim, Claimed
        config = glide_sync.GlideClientConfiguration([glide_sync.NodeAddress(HOST, PORT)])
        client = glide_sync.GlideClient.create(config)
        assert isinstance(Claim(client, KEY).acquire(), Claimed)
        client.close()
    """,
    "glide": """
        import asyncio, glide
        from goblin_claim import AsyncClaim, Claimed

        async def main():
            config = glide.GlideClientConfiguration([glide.NodeAddress(HOST, PORT)])
            client = await glide.GlideClient.create(config)
            assert isinstance(await AsyncClaim(client, KEY).acquire(), Claimed)
            await client.close()

        asyncio.run(main())
    """,
}
# Resolved apart: arq pins redis<6, which the other extras' redis-py would not allow beside it.
APART = ("arq",)


def _run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    """``args`` run to completion; their output, or a failure that shows it."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def _metadata(wheel: Path) -> tuple[list[str], str, str]:
    """The wheel's file names, its METADATA and its entry_points.txt."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        return names, archive.read(f"{info}/METADATA").decode(), archive.read(f"{info}/entry_points.txt").decode()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist and the wheel, built from the checkout into a directory outside it."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", out, ROOT], cwd=out)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def wheelhouse(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every wheel an install below needs, downloaded once."""
    _, wheel = built
    house = tmp_path_factory.mktemp("wheelhouse")
    together = ",".join(extra for extra in USES if extra not in APART)
    for extras in (together, *APART):
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", house, f"{wheel}[{extras}]"], cwd=house)
    return house


def _venv(where: Path, wheel: Path, house: Path, extra: str | None) -> Path:
    """A clean environment at ``where`` with the wheel (and ``extra``) installed from ``house`` alone."""
    _run([sys.executable, "-m", "venv", "--without-pip", where], cwd=where.parent)
    python = where / "bin" / "python"
    target = f"{wheel}[{extra}]" if extra else str(wheel)
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-index"]
    _run([*pip, "--find-links", house, target], cwd=where.parent)
    return python


def _program(body: str, port: int, key: str) -> str:
    """``body`` with the server's address bound, after a check that it runs the installed package."""
    return "\n".join(
        [
            "import goblin_claim, sys",
            "assert goblin_claim.__file__.startswith(sys.prefix), goblin_claim.__file__",
            f"HOST, PORT, KEY = {servers.HOST!r}, {port}, {key!r}",
            textwrap.dedent(body).strip(),
            'print("ok")',
        ]
    )


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would reach the checkout's package."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COV_", "COVERAGE"))}
    return {**env, **extra}


def test_the_sdist_and_the_wheel_hold_the_package_and_pass_twine_check(built: tuple[Path, Path]) -> None:
    """Both pass ``twine check``; the wheel has every file of the package, ``py.typed`` and the command."""
    sdist, wheel = built
    _run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel], cwd=wheel.parent)
    names, metadata, entry_points = _metadata(wheel)
    package = ROOT / "goblin_claim"
    shipped = {
        path.relative_to(ROOT).as_posix()
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    scripts = {name for name in shipped if name.endswith(".lua")}
    assert scripts, "the package has no Lua scripts to ship"
    assert "goblin_claim/py.typed" in shipped
    assert shipped <= set(names), sorted(shipped - set(names))
    assert re.search(r"^goblin-claim = goblin_claim\._cli\.main:main$", entry_points, re.M), entry_points
    for extra in USES:
        assert f"Provides-Extra: {extra}" in metadata, extra
    assert "Requires-Dist: redis>=5.2" in metadata
    assert "Requires-Dist: pydantic>=2.7" in metadata
    assert {name for name in names if name.endswith(".lua")} == scripts  # and no stray ones


def test_the_installed_wheel_runs_the_tutorial_the_command_and_doctor(
    built: tuple[Path, Path], wheelhouse: Path, tmp_path: Path, redis_standalone: RedisProcess
) -> None:
    """From a clean install with ``[testing]``: the tutorial's samples, ``--help`` and ``doctor`` on a real server."""
    _, wheel = built
    python = _venv(tmp_path / "venv", wheel, wheelhouse, "testing")
    url = f"redis://{servers.HOST}:{redis_standalone.port}/9"
    env = _clean_env(REDIS_URL=url)
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text("utf-8"), re.S)
    assert len(blocks) >= 4, "the tutorial's samples were not found"
    script = tmp_path / "tutorial.py"
    script.write_text(_program("\n".join(blocks), redis_standalone.port, "unused"), "utf-8")
    assert _run([python, script], cwd=tmp_path, env=env).strip().endswith("ok")

    command = tmp_path / "venv" / "bin" / "goblin-claim"
    assert "doctor" in _run([command, "--help"], cwd=tmp_path, env=env)
    # --ephemeral: the test server keeps no AOF, which is a note then; everything else must pass,
    # and the scripts doctor loads and runs come from the install.
    report = _run([command, "doctor", "--url", url, "--ephemeral"], cwd=tmp_path, env=env)
    assert "Lua" in report, report


@pytest.mark.parametrize("extra", sorted(USES))
def test_each_extra_installs_what_its_door_needs(
    extra: str, built: tuple[Path, Path], wheelhouse: Path, tmp_path: Path, redis_standalone: RedisProcess
) -> None:
    """The wheel with this extra alone, in a clean environment: its door imports and works."""
    _, wheel = built
    python = _venv(tmp_path / "venv", wheel, wheelhouse, extra)
    program = _program(USES[extra], redis_standalone.port, f"wheel-{extra}-{os.getpid()}")
    assert _run([python, "-c", program], cwd=tmp_path, env=_clean_env()).strip().endswith("ok")


def test_without_extras_the_core_and_the_framework_free_doors_import(
    built: tuple[Path, Path], wheelhouse: Path, tmp_path: Path, redis_standalone: RedisProcess
) -> None:
    """The bare wheel: a claim on a real server, the ASGI and WSGI doors; a door with an extra needs it."""
    _, wheel = built
    python = _venv(tmp_path / "venv", wheel, wheelhouse, None)
    program = _program(
        """
        import importlib, redis
        import goblin_claim.asgi, goblin_claim.wsgi
        from goblin_claim import Claim, Claimed
        assert isinstance(Claim(redis.Redis(HOST, PORT), KEY).acquire(), Claimed)
        try:
            importlib.import_module("goblin_claim.celery")
        except ImportError:
            pass
        else:
            raise AssertionError("celery came with the bare wheel")
        """,
        redis_standalone.port,
        f"wheel-bare-{os.getpid()}",
    )
    assert _run([python, "-c", program], cwd=tmp_path, env=_clean_env()).strip().endswith("ok")


def test_the_extras_tested_here_are_the_ones_the_package_declares(built: tuple[Path, Path]) -> None:
    """A new extra is tried above as soon as it is declared (``USES`` names a use for each)."""
    _, metadata, _ = _metadata(built[1])
    declared = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M))
    assert declared == set(USES)
