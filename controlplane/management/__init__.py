"""Django's management commands of the control plane (``manage.py <name>``): thin shell
edges over the commands and the reads."""
