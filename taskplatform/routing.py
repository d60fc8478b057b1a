"""Websocket routes (the live-progress consumers add themselves here)."""

websocket_urlpatterns: list = []
