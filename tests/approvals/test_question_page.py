"""The question's page leads with the decision, and the inbox's columns fit a 1,280 px screen.
Through Django's test client; widths and positions are measured in a browser (tests/browser)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals.models import Question
from approvals.services import question_answer
from tests.approvals.conftest import paused_on

pytestmark = pytest.mark.django_db
CHANGELIST = "admin:approvals_question_changelist"
LONG_PROMPT = ("Approve the refund of the duplicated March invoice for ACME Industries, including the late fee that "
               "was charged twice?")


def page_of(client, question) -> str:
    return client.get(reverse("admin:approvals_question_change", args=[question.pk])).content.decode()


def test_the_page_leads_with_the_prompt_the_details_and_the_form_then_the_technical_fields(client, reviewer):
    _, question = paused_on({"prompt": "Ship release 4.2?", "details": {"changes": "12 fixes"}, "timeout": 7200})
    client.force_login(reviewer)
    page = page_of(client, question)
    order = [page.index(marker) for marker in (
        '<h2 id="decision-prompt" class="prompt">Ship release 4.2?</h2>', "<dt>changes</dt><dd>12 fixes</dd>",
        'id="answer-form"', 'name="_approve"', 'id="ledger"', "fieldset-heading\">Technical")]
    assert order == sorted(order)
    technical = page[page.index('fieldset class="module aligned collapse"'):]
    assert technical.index("<details><summary>") < 200  # collapsed until asked for
    assert "(in 2 h); then" in page  # the deadline, and how far off
    # The window's title, the breadcrumbs and the decision; not again as a subtitle or a field.
    assert page.count("Ship release 4.2?") == 3


def test_an_answered_question_shows_its_answer_where_the_form_was(client, reviewer):
    _, question = paused_on({"prompt": "Ship?"})
    question_answer(question_id=question.pk, user=reviewer, answer={"approved": False, "reason": "not yet"},
                    comment="not yet", channel="api")
    client.force_login(reviewer)
    page = page_of(client, question)
    answered = page[page.index('id="answered"'):page.index('id="ledger"')]
    assert "<dt>approved</dt><dd>no</dd>" in answered and "by reviewer" in answered and "not yet" in answered
    assert 'id="answer-form"' not in page


def test_the_inbox_shows_the_prompt_short_with_the_whole_on_hover_and_the_time_left_short(client, reviewer):
    _, long = paused_on({"key": "long", "prompt": LONG_PROMPT, "timeout": 7200})
    _, late = paused_on({"key": "late", "timeout": 60})
    Question.objects.filter(pk=late.pk).update(expires_at=timezone.now() - timedelta(minutes=5, seconds=10))
    client.force_login(reviewer)
    page = client.get(reverse(CHANGELIST)).content.decode()
    headers = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', page)
    assert headers == ["prompt_short", "job_link", "status_label", "time_left", "age"]
    assert f'title="{LONG_PROMPT}"' in page and LONG_PROMPT[:50] in page and f">{LONG_PROMPT}<" not in page
    assert ">in 2 h<" in page and '<strong class="overdue">overdue 5 min</strong>' in page
    assert "approvals/admin.css" in page  # the columns, and the list below 800 px
