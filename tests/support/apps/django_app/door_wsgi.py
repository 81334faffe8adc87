"""The Django door under WSGI, as gunicorn serves it: ``get_wsgi_application()`` with door_settings."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.apps.django_app.door_settings"
application = get_wsgi_application()
