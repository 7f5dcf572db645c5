"""specbench: a benchmarking harness for speculative decoding."""
from . import paper_tables
from .models.heads import names as head_names

__version__ = "0.1.0"

# what conf/ relies on, in place before anything composes or resolves a config: the papers' hyper-parameter
# tables as configs (paper_tables.py) and the resolvers naming a draft head (models/heads/names.py)
paper_tables.register()
head_names.register()
