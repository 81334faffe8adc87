"""Settings with the Django door installed: a header-reading auth middleware, then IdempotencyMiddleware.

``GOBLIN_TEST_REDIS_PORT`` names the server, ``GOBLIN_TEST_NAMESPACE`` the keys'
prefix, ``GOBLIN_TEST_WAIT`` how long a duplicate waits for a first request;
``GOBLIN_TEST_AT_MOST_ONCE=1`` and ``GOBLIN_TEST_EXPOSE_HOLDER=1`` turn those options on,
``GOBLIN_TEST_LEASE`` sets the lease.
"""

from __future__ import annotations

import os

from tests.support.apps import answers
from tests.support.apps.django_app.settings import *  # noqa: F403 -- the same project, with the door added

answers.log_to_file()

INSTALLED_APPS = ["goblin_claim.django.GoblinClaimConfig"]
MIDDLEWARE = ["tests.support.apps.django_app.auth.HeaderUserMiddleware", "goblin_claim.django.IdempotencyMiddleware"]
GOBLIN_CLAIM_IDEMPOTENCY = {
    "client": f"redis://127.0.0.1:{os.environ['GOBLIN_TEST_REDIS_PORT']}/0",
    "namespace": os.environ["GOBLIN_TEST_NAMESPACE"],
    "wait": float(os.environ.get("GOBLIN_TEST_WAIT", "0")),
    "scope": lambda request: request.user_id,
    "lease": int(os.environ.get("GOBLIN_TEST_LEASE", "30")),
    "at_most_once": os.environ.get("GOBLIN_TEST_AT_MOST_ONCE") == "1",
    "expose_holder": os.environ.get("GOBLIN_TEST_EXPOSE_HOLDER") == "1",
    "server_errors": answers.SERVER_ERRORS,
}
# The tests' auth is a header read by a custom middleware, not Django's AuthenticationMiddleware.
SILENCED_SYSTEM_CHECKS = ["goblin_claim.W001"]
