"""URLs: a health check, one sync and one async view, one with its own idempotency options."""

from __future__ import annotations

from django.urls import path

from tests.django_app import views

urlpatterns = [
    path("health", views.health),
    path("orders/sync", views.order_sync),
    path("orders/async", views.order_async),
    path("orders/own", views.order_own),
]
