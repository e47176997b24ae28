"""The browser dashboard: server-rendered pages, kept live by the change feeds.

Pages are Django templates (``templates/ui/``) with htmx; a page opens a websocket
(:mod:`controlplane.sockets.pages`, the page modes) that sends re-rendered partials for
out-of-band swaps after each commit, each tagged with the ``seq`` (or, on pages that
span sessions, the commit id) it reflects. Reads go through the API's query functions
(:mod:`controlplane.api`) and actions through the very same functions as the API's
(:mod:`controlplane.api.actions`), so the two never disagree.

Modules: :mod:`.snapshots` (consistent reads of a page's data), :mod:`.fragments`
(the partials a socket sends), one module of views per page group (:mod:`.sessions`,
:mod:`.tasks`, :mod:`.attention`, :mod:`.workers`), :mod:`.access` (who may see and act)
and :mod:`.urls`.
"""
