"""Hosts: agents written in a framework, run durably on the kernel (DESIGN §14).

Each subpackage connects one framework's native state (its checkpoints, messages, tool
calls) with the kernel's records, tasks and commits. A framework is imported only by its
own subpackage, and only when that subpackage is imported: the kernel itself stays
framework-free (tests/unit/test_boundaries.py).
"""
