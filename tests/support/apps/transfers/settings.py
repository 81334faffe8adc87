"""The service's settings: the Django door on every keyed POST, keeping a 5xx (``server_errors="store"``)."""

from __future__ import annotations

from typing import Any

SECRET_KEY = "goblin-claim tests only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.support.apps.transfers.views"
INSTALLED_APPS = ["goblin_claim.django.GoblinClaimConfig"]
MIDDLEWARE = ["goblin_claim.django.IdempotencyMiddleware"]
DATABASES: dict[str, Any] = {}
USE_TZ = True
GOBLIN_CLAIM_CLIENT = "tests.support.apps.transfers.clients.make_client"
# A transfer books its ledger row before it enqueues its receipt: a 500 after that is kept
# and replayed, never run again (the HTTP page's "Server errors: give back, or store").
GOBLIN_CLAIM_IDEMPOTENCY = {"required": True, "server_errors": "store"}
