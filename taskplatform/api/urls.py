"""The API's routes, included under `api/` by `taskplatform.urls`."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import SimpleRouter

from approvals.apis import QuestionViewSet
from jobs.apis import JobKindListApi, JobViewSet, WsTicketApi
from waits.apis import WaitViewSet, WakeApi
from webhooks.apis import WebhookViewSet

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("questions", QuestionViewSet, basename="question")
router.register("waits", WaitViewSet, basename="wait")
router.register("webhooks", WebhookViewSet, basename="webhook")

urlpatterns = [
    path("job-kinds/", JobKindListApi.as_view(), name="job-kind-list"),
    path("wake/<str:token>/", WakeApi.as_view(), name="wait-wake"),
    path("ws-tickets/", WsTicketApi.as_view(), name="ws-ticket"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    *router.urls,
]
