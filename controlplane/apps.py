from django.apps import AppConfig


class ControlplaneConfig(AppConfig):
    name = "controlplane"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Durable control plane"
