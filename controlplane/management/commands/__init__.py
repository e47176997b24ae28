"""One module per ``manage.py`` command (Django finds them here by convention)."""
