"""The jobs pages: `/jobs/` and `/jobs/{id}/` (see `jobs.pages`)."""

from django.urls import path

from jobs import pages

app_name = "jobs"

urlpatterns: list = [
    path("jobs/", pages.job_list_page, name="job-list"),
    path("jobs/submit/", pages.job_submit_page, name="job-submit"),
    path("jobs/<uuid:job_id>/", pages.job_detail_page, name="job-detail"),
    path("jobs/<uuid:job_id>/panel/", pages.job_panel, name="job-panel"),
]
