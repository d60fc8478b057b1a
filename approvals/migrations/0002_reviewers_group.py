"""The `reviewers` group: what a reviewer needs to use the inbox in the admin and to answer."""

from django.db import migrations

REVIEWER_PERMISSIONS = [
    ("jobs", "view_job"),
    ("jobs", "view_jobevent"),
    ("approvals", "view_question"),
    ("approvals", "answer_question"),
]


def create_group(apps, schema_editor):
    # Permissions are normally made after all migrations ran (post_migrate); make them now.
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None

    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name="reviewers")
    for app_label, codename in REVIEWER_PERMISSIONS:
        group.permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))


def remove_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="reviewers").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0001_initial"),
        ("jobs", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_group, remove_group)]
