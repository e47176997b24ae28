"""The reference apps this deployment runs by default, and the registry that wires them:
the email notices (:mod:`.notices`) and the demo assistant (:mod:`.assistant`).

They are applications of the platform, not part of it: the reads, the commands and the
edges know task kinds and document kinds only through the kernel's Registry, which
:mod:`.registry` builds.
"""
