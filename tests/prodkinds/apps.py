from django.apps import AppConfig


class ProdKindsConfig(AppConfig):
    """A deployment's own job kind, for tests of processes under the production settings (which
    install no demo kinds)."""

    name = "tests.prodkinds"
    label = "prodkinds"
