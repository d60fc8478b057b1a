"""On PostgreSQL the waits' ledger refuses UPDATE and DELETE at the database too; and reviewers
(who may stand in for a service in a combined wait) may open waits and their ledger in the admin."""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION waits_waitdecision_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the waits ledger is append-only: % of waits_waitdecision refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
"""
TRIGGER = """
CREATE TRIGGER waits_waitdecision_append_only
BEFORE UPDATE OR DELETE ON waits_waitdecision
FOR EACH ROW EXECUTE FUNCTION waits_waitdecision_append_only();
"""
DROP = """
DROP TRIGGER IF EXISTS waits_waitdecision_append_only ON waits_waitdecision;
DROP FUNCTION IF EXISTS waits_waitdecision_append_only();
"""


def add_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION, params=None)  # no placeholders: RAISE uses a literal %
        schema_editor.execute(TRIGGER, params=None)


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


def reviewers_see_waits(apps, schema_editor):
    # Permissions are normally made after all migrations ran (post_migrate); make them now.
    from django.contrib.auth.management import create_permissions

    app_config = apps.get_app_config("waits")
    app_config.models_module = True
    create_permissions(app_config, verbosity=0)
    app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name="reviewers")
    group.permissions.add(*Permission.objects.filter(content_type__app_label="waits",
                                                     codename__in=["view_wait", "view_waitdecision"]))


class Migration(migrations.Migration):
    dependencies = [
        ("waits", "0002_combined_wait_person_ledger"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(add_trigger, drop_trigger),
        migrations.RunPython(reviewers_see_waits, migrations.RunPython.noop),
    ]
