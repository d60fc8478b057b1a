from django.apps import apps
from django.contrib import admin
from django.urls import include, path

from accounts.login_throttle import admin_login
from jobs.sse import job_events_stream

urlpatterns = [
    # The admin's sign-in, throttled against password guessing; before the admin's own route.
    path("admin/login/", admin_login, name="admin-login"),
    path("admin/", admin.site.urls),
    # Server-Sent Events, an async view: before the API's include, which would answer it otherwise.
    path("api/jobs/<str:job_id>/events/stream/", job_events_stream, name="job-events-stream"),
    path("api/", include("taskplatform.api.urls")),
    path("", include("ops.urls")),
    path("", include("approvals.urls")),
    path("", include("jobs.urls")),
]

if apps.is_installed("demo"):
    # The simulated generation service of `demo.generate` (plays an outside system): development
    # and tests only; the production settings do not install `demo`, so `/sim/` answers 404 there.
    urlpatterns.insert(0, path("sim/", include("demo.simulator")))
