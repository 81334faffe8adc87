"""Settings: no database, no installed apps, no middleware (so no CSRF check on the test POSTs)."""

from __future__ import annotations

from typing import Any

SECRET_KEY = "goblin-claim tests only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.support.apps.django_app.urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES: dict[str, Any] = {}
USE_TZ = True
LOGGING_CONFIG = None  # the server's stderr is read by the tests: Django's defaults add nothing there
