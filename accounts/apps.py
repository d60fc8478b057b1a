from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts and API tokens"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts.credentials import sessions_still_valid, tokens_still_valid
        from jobs.streams import credential_kind_register

        # Live streams (websockets, SSE) are re-checked against the credential they opened with.
        credential_kind_register("token", tokens_still_valid)
        credential_kind_register("session", sessions_still_valid)
