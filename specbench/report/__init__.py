"""Turning records into tables: the console summary now; paper tables and figures build on it."""
