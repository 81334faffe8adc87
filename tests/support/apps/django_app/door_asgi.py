"""The Django door under ASGI, as uvicorn serves it: ``get_asgi_application()`` with door_settings."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.apps.django_app.door_settings"
application = get_asgi_application()
