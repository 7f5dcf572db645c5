"""Shared decoding machinery: cached forwards and KV bookkeeping, sampling, verification.

Methods compose these pieces instead of copying loops.
"""
