"""Hosts: agents written in a framework, run durably on the kernel.

Each subpackage adapts one framework and is the only module that imports it (an optional
dependency): the kernel itself stays framework-free.
"""
