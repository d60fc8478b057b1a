"""Questions asked before assignees existed go to the group `reviewers` (who could answer them
then); reviewers may read the decision ledger; and on PostgreSQL the ledger refuses UPDATE and
DELETE at the database too."""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION approvals_decision_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the decision ledger is append-only: % of approvals_decision refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
"""
TRIGGER = """
CREATE TRIGGER approvals_decision_append_only
BEFORE UPDATE OR DELETE ON approvals_decision
FOR EACH ROW EXECUTE FUNCTION approvals_decision_append_only();
"""
DROP = """
DROP TRIGGER IF EXISTS approvals_decision_append_only ON approvals_decision;
DROP FUNCTION IF EXISTS approvals_decision_append_only();
"""


def assign_existing(apps, schema_editor):
    Question = apps.get_model("approvals", "Question")
    Group = apps.get_model("auth", "Group")
    group = Group.objects.filter(name="reviewers").first()
    for question in Question.objects.all().iterator():
        question.opened_at = question.created_at
        question.save(update_fields=["opened_at"])
        if group is not None and not question.assigned_groups.exists() and not question.assigned_users.exists():
            question.assigned_groups.add(group)


def reviewers_read_the_ledger(apps, schema_editor):
    # Permissions are normally made after all migrations ran (post_migrate); make them now.
    from django.contrib.auth.management import create_permissions

    app_config = apps.get_app_config("approvals")
    app_config.models_module = True
    create_permissions(app_config, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name="reviewers")
    group.permissions.add(Permission.objects.get(content_type__app_label="approvals", codename="view_decision"))


def add_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION, params=None)  # no placeholders: RAISE uses a literal %
        schema_editor.execute(TRIGGER, params=None)


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0003_questions_typed_assigned_ledger"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(assign_existing, migrations.RunPython.noop),
        migrations.RunPython(reviewers_read_the_ledger, migrations.RunPython.noop),
        migrations.RunPython(add_trigger, drop_trigger),
    ]
