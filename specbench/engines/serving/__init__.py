"""Serving: production inference servers started and stopped by the harness, and the load sent to them
(load.py: schedules; driver.py: one load level's requests; process.py: a server's lifetime; client.py: one streamed
request)."""
