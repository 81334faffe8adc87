"""An install without the optional valkey-py: redis-py's clients alone, and the valkey pieces say what to install.

Run in a fresh interpreter where ``import valkey`` fails, as it does without the
``[valkey]`` extra (the suite's own interpreter has valkey-py installed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import io, json, sys
    sys.modules["valkey"] = None  # as if valkey-py were not installed: its import raises ImportError
    from goblin_claim import Claim, Claimed
    from goblin_claim._cli.main import main
    from goblin_claim._clients import families
    import goblin_claim.testing as testing
    found = {"sync": [f"{c.__module__}.{c.__qualname__}" for c in families.SYNC_CLIENTS]}
    found["errors"] = [f"{c.__module__}.{c.__qualname__}" for c in families.ERRORS]
    try:
        testing.fake_valkey(native=False)
    except ImportError as exc:
        found["fake_valkey"] = str(exc)
    found["claimed"] = isinstance(Claim(testing.fake_redis(native=False), "k").acquire(), Claimed)
    out = io.StringIO()
    found["cli"] = [main(["inspect", "k", "--url", "valkey://127.0.0.1:1/0"], out=out), out.getvalue()]
    print(json.dumps(found))
    """
)


def test_without_valkey_py_the_sdk_runs_on_redis_py_and_says_what_to_install() -> None:
    """Only redis-py's clients and errors count; fake_valkey and valkey:// URLs name the extra to install."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(done.stdout)
    assert found["sync"] == ["redis.client.Redis"]
    assert found["errors"] == ["redis.exceptions.RedisError", "redis.exceptions.RedisClusterException"]
    assert found["fake_valkey"] == "fake_valkey needs valkey-py: pip install 'goblin-claim[testing,valkey]'"
    assert found["claimed"] is True
    status, text = found["cli"]
    assert status == 1
    assert "valkey:// URLs need valkey-py: pip install 'goblin-claim[valkey]'" in text
    assert "(or give a redis:// URL: a Valkey server takes those too)" in text
