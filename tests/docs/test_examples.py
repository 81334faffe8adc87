"""The examples run as users run them, on the embedded fake and on a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.servers import RedisProcess

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["claims it", "races in", "publishes the answer", "same answer", "crashes mid-charge", "takes over", "done"]


def _run(script: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_payment_webhook_on_the_embedded_fake() -> None:
    """The demo narrates every step of the seed's story and ends with each event charged once."""
    output = _run("payment_webhook.py", REDIS_URL="")
    assert "embedded fakeredis" in output
    for step in STEPS:
        assert step in output, step
    assert "value=b'charged:txn_551'" in output


def test_payment_webhook_on_a_real_server(redis_standalone: RedisProcess) -> None:
    """With REDIS_URL set, the demo runs the same story against that server."""
    output = _run("payment_webhook.py", REDIS_URL=f"redis://127.0.0.1:{redis_standalone.port}/0")
    assert f"127.0.0.1:{redis_standalone.port}" in output
    for step in STEPS:
        assert step in output, step


HANDLERS = {
    "webhook_handler.py": ["redelivery", "1 distinct receipt(s)", "PayloadMismatchError", "['evt88', 'evt89']"],
    "fastapi_service.py": [
        "retry while running      -> status=409",
        "first request            -> status=201 replayed=-",
        "retry after it ended     -> status=201 replayed=true",
        "same key, new body       -> status=422",
        "no key                   -> status=400",
        "same key, other user     -> status=201 replayed=-",
        "GET passes through       -> status=200",
        "orders created: ['tea', 'coffee']",
    ],
    "flask_service.py": [
        "retry while running      -> status=409",
        "retry after it ended     -> status=201 replayed=true",
        "same key, new body       -> status=422",
        "no key                   -> status=400",
        "no user                  -> status=403",
        "same key, other user     -> status=201 replayed=-",
        "orders created: ['tea', 'coffee']",
    ],
    "django_service.py": [
        "retry while running      -> status=409",
        "retry after it ended     -> status=201 replayed=true",
        "same key, new body       -> status=422",
        "no user                  -> status=403",
        "unknown path             -> status=404",
        "refund again, by bob     -> status=201 replayed=true",
        "work done: ['tea', 'coffee', 'refund']",
    ],
}


def test_handler_examples_on_the_embedded_fake() -> None:
    """The handler examples (the decorator on a webhook, the HTTP doors on FastAPI, Flask, Django) run as promised."""
    for script, expected in HANDLERS.items():
        output = _run(script, REDIS_URL="")
        for text in expected:
            assert text in output, (script, text)


def test_handler_examples_on_a_real_server(redis_standalone: RedisProcess) -> None:
    """The handler examples run unchanged against a real server through REDIS_URL."""
    for script, expected in HANDLERS.items():
        output = _run(script, REDIS_URL=f"redis://127.0.0.1:{redis_standalone.port}/0")
        for text in expected:
            assert text in output, (script, text)


FENCING = [
    "greater: True",
    "'shipped by worker-2': accepted=True",
    "'shipped by worker-1': accepted=False",
    "ClaimLostError",
    "the ledger says: shipped by worker-2",
]


def test_fencing_example_on_the_embedded_fake() -> None:
    """The fencing example: the stale owner's write is refused by the SQLite store and by complete()."""
    output = _run("fencing.py", REDIS_URL="")
    for text in FENCING:
        assert text in output, text


def test_fencing_example_on_a_real_server(redis_standalone: RedisProcess) -> None:
    """The fencing example runs unchanged against a real server."""
    output = _run("fencing.py", REDIS_URL=f"redis://127.0.0.1:{redis_standalone.port}/0")
    for text in FENCING:
        assert text in output, text


OBSERVABILITY = [
    "charged ord-",
    ": 1 time(s)",
    "took over a claim whose lease lapsed",
    "result is gone",
    "call       completed          1",
    "wait       taken_over         1",
    "goblin_claim.wait        outcome=taken_over",
    "taken over",
    "done",
]


def test_observability_example_on_the_embedded_fake() -> None:
    """The observability example prints the operator's WARNINGs, the listener's counts, spans and the histogram."""
    output = _run("observability.py", REDIS_URL="")
    for text in OBSERVABILITY:
        assert text in output, text


def test_observability_example_on_a_real_server(redis_standalone: RedisProcess) -> None:
    """The observability example runs unchanged against a real server."""
    output = _run("observability.py", REDIS_URL=f"redis://127.0.0.1:{redis_standalone.port}/0")
    for text in OBSERVABILITY:
        assert text in output, text


STREAMS = [
    "a: dies now, after charging evt003",
    "b took a's unstarted messages over",
    "unstarted claim(s) in one round trip",
    "42 events charged, 42 charges, charged more than once: []",
    "(a died there; it runs again once its 30 s lease lapses): ['evt003']",
]


def test_streams_consumer_example_on_the_embedded_fake() -> None:
    """The Streams example: a dead consumer's batch is taken over, a shutdown gives back, nothing runs twice."""
    output = _run("streams_consumer.py", REDIS_URL="")
    for text in STREAMS:
        assert text in output, text


def test_streams_consumer_example_on_a_real_server(redis_standalone: RedisProcess) -> None:
    """The Streams consumer example runs unchanged against a real server."""
    output = _run("streams_consumer.py", REDIS_URL=f"redis://127.0.0.1:{redis_standalone.port}/0")
    for text in STREAMS:
        assert text in output, text
