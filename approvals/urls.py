"""The approvals pages outside the admin: answering a question from its job's page."""

from django.urls import path

from approvals import pages

app_name = "approvals"

urlpatterns: list = [
    path("jobs/<uuid:job_id>/questions/<uuid:question_id>/answer/", pages.question_answer_view,
         name="question-answer"),
]
