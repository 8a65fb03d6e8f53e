"""Running the service: the checks before a server starts, the core each serving process runs
on, the purge of old mail, metrics, logs, backups of the embedded store, and the version that
runs.
"""
