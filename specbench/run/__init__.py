"""One run around the engines: its identity, inputs and checks before anything loads (components.py,
config_check.py; a value against its annotation: specbench/config_types.py), the rounds, pairing and resume
(runner.py), the heads' accounts beside the records (head_accounts.py) and the summaries (summaries.py)."""
