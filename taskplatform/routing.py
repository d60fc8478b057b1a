"""Websocket routes: a job's live event stream and the feed of status changes."""

from django.urls import path

from jobs.consumers import JobEventsConsumer, JobFeedConsumer

websocket_urlpatterns: list = [
    path("ws/jobs/<str:job_id>/", JobEventsConsumer.as_asgi()),
    path("ws/jobs/", JobFeedConsumer.as_asgi()),
]
