"""The read layer: everything the API, the pages, the feeds and the metrics show.

The rule for how it reads:

- Records are selected, filtered, counted and paged through the Django models, which
  mirror the kernel's tables read-only, and each row becomes a kernel record through
  the storage's schema mapping (by column name). What leaves this package is a kernel
  record or a view dataclass built on one, never an ORM row passed off as a record.
- Raw SQL on the ``kernel_*`` tables appears only here (and in the storage): where the
  ORM cannot say it (the change feed's visibility rule, aggregates by shown status).
- A page that shows several reads runs them in one :func:`~.snapshot.snapshot`, so
  the position it is tagged with is exactly the state it shows.
- Reads never write and never start scheduling.

Commands (:mod:`controlplane.commands`) may use these reads; reads never use commands.
"""
