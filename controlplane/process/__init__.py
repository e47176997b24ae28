"""What every process of the control plane does when it starts, whatever it runs: the
container image's entry point (:mod:`.entrypoint`: web, worker, beat, migrate), logs,
traces, and freezing the start-up heap.
"""
