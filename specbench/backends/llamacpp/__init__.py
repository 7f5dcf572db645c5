"""llama.cpp through llama-cpp-python: a context per model and role (context.py), the language-model interface
over it (lm.py)."""
