"""The waits pages outside the admin: a person's action on a combined wait from its job's page."""

from django.urls import path

from waits import pages

app_name = "waits"

urlpatterns: list = [
    path("jobs/<uuid:job_id>/waits/<int:wait_id>/act/", pages.wait_act_view, name="wait-act"),
]
