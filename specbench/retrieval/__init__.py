"""REST (He et al. 2024): retrieval of continuations from a datastore built offline (a suffix array)."""
