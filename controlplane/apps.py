from django.apps import AppConfig


class ControlplaneConfig(AppConfig):
    name = "controlplane"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Durable control plane"

    def ready(self) -> None:
        from controlplane.process import telemetry

        telemetry.setup()  # every process: web, worker, beat, management commands
