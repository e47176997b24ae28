"""Django project and app of the durable control plane (see DESIGN.md §2)."""
