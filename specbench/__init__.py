"""specbench: a benchmarking harness for speculative decoding."""
__version__ = "0.1.0"
