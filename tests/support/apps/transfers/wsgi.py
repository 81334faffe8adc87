"""The service as gunicorn serves it: ``gunicorn tests.support.apps.transfers.wsgi:application``."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.apps.transfers.settings")
application = get_wsgi_application()
