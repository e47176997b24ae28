"""The browser dashboard: server-rendered pages, kept live by the change feeds.

Pages are Django templates (``templates/ui/``) with htmx; a page opens a websocket
(:mod:`controlplane.sockets.pages`, the page modes) that sends re-rendered partials for
out-of-band swaps after each commit, each tagged with the ``seq`` (or, on pages that
span sessions, the commit id) it reflects. Reads go through :mod:`controlplane.reads`
and actions through :mod:`controlplane.commands`, the functions the API calls too, so the
two never disagree; nothing here imports the API.

Modules: :mod:`.live` (the registry of live pages: what each shows, the parts its socket
re-renders), one module of views per page group (:mod:`.sessions`, :mod:`.tasks`,
:mod:`.workers`), :mod:`.actions` (the operator actions behind the buttons),
:mod:`.charts` (server-rendered SVG charts), :mod:`.login` (the throttled login forms),
:mod:`.access` (who may see and act) and :mod:`.urls`.
"""
