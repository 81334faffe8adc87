"""URLs: a health check, a sync and an async view, two with their own idempotency options, a webhook ignored."""

from __future__ import annotations

from django.urls import path

from tests.support.apps.django_app import views

urlpatterns = [
    path("health", views.health),
    path("orders/sync", views.order_sync),
    path("orders/async", views.order_async),
    path("orders/own", views.order_own),
    path("orders/misconfigured", views.order_misconfigured),
    path("webhook", views.webhook),
    path("answer", views.answer),
    path("answer/ignored", views.answer_ignored),
]
