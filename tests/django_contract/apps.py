from django.apps import AppConfig


class DjangoContractConfig(AppConfig):
    name = "tests.django_contract"
    label = "django_contract"
    # Django's own test suite runs on AutoField; the ported tests compare primary keys as it does.
    default_auto_field = "django.db.models.AutoField"
