"""The project of ``tests/http/django_project.py`` as gunicorn serves it, its client used once before the fork.

Under ``--preload`` gunicorn imports this in its master: the project's client made here
is the master's, and each worker must make its own.
"""

from __future__ import annotations

import logging
import os

from django.core.wsgi import get_wsgi_application

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.http.django_project"
application = get_wsgi_application()

import goblin_claim.django  # noqa: E402 -- after Django's set-up
from tests.support.apps import answers  # noqa: E402

answers.log_to_file()
logging.getLogger("goblin_claim").setLevel(logging.DEBUG)  # the request events' lines too
goblin_claim.django.client().ping()  # a start-up check, as a project might run one in AppConfig.ready()
