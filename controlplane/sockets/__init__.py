"""What a web process runs for its websockets and long-polls: the change feed, the live
pages, the hints that tell them a commit happened (:mod:`.notify`, published by whatever
process commits), each account's socket slots and render turns, and closing them all
when the process stops.
"""
