"""Settings for the system-check test: Django's auth middleware listed before or after the door (GOBLIN_TEST_ORDER)."""

from __future__ import annotations

import os

from tests.support.apps.django_app.settings import *  # noqa: F403 -- the same project

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "goblin_claim.django.GoblinClaimConfig",
]
_AUTH = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
_DOOR = ["goblin_claim.django.IdempotencyMiddleware"]
MIDDLEWARE = _DOOR + _AUTH if os.environ["GOBLIN_TEST_ORDER"] == "before" else _AUTH + _DOOR
GOBLIN_CLAIM_IDEMPOTENCY = {"client": "redis://127.0.0.1:1/0", "scope": lambda request: request.user.pk}
