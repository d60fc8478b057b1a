"""Operations endpoints (mounted at the root: /metrics, /readyz, /ops/)."""

urlpatterns: list = []
