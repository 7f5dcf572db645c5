"""Decoding methods, one per file. Each config in conf/method/ names its class through `_target_`."""
