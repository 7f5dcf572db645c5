"""specbench: a benchmarking harness for speculative decoding."""

__version__ = "0.1.0"

# Importing the package registers nothing: the programs that compose conf/ call cli.register_configs first.
