"""A Django + RQ payments service, built from the manual's pages alone, for the trial in tests/deployment.

``settings`` (``DJANGO_SETTINGS_MODULE=tests.support.apps.transfers.settings``): the
Django door on every keyed POST with ``server_errors="store"``, the project's client
from ``GOBLIN_CLAIM_CLIENT`` (``clients.make_client``, the Django page's factory);
``views``: ``POST /api/transfers`` (a ledger row, then the transfer's receipt job through
``enqueue_once``) and ``POST /webhooks/events`` (an ``@idempotent`` function keyed by the
event's id, its errors answered by ``problem_response``); ``jobs``: the receipt job under
``@idempotent_job``, run by ``rq worker`` as the RQ page starts it; ``wsgi``: what
gunicorn serves. Every side effect is a row in ``ledger`` (a sqlite file without a
UNIQUE constraint: a double is a second row). ``faults``: the points a test holds a
process at, to kill it there.

Environment: ``REDIS_URL`` (the one Redis: claims, queue, results), ``TRIAL_DIR`` (the
fault points' files), ``TRIAL_LEDGER`` (the sqlite file).
"""
