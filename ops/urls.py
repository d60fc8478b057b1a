"""Operations endpoints (mounted at the root: /metrics, /healthz, /readyz, /ops/)."""

from django.urls import include, path

from ops import dashboard, views

urlpatterns: list = [
    path("metrics", views.metrics, name="metrics"),  # Prometheus (ops.metrics); Flower keeps its own
    path("healthz", views.healthz, name="healthz"),  # the database and Redis
    path("readyz", views.readyz, name="readyz"),  # database, Redis and the workers' heartbeats
    path("ops/", include(dashboard.urlpatterns)),  # the staff dashboard and its data (ops.dashboard)
]
