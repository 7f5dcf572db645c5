"""How forwards run: the language-model interface (language_model.py) and its implementations — transformers
eager, over a static cache and in CUDA graphs (torch/), and llama.cpp (llamacpp/) — with what they share: device
staging, the host-read counter, token-tree masks, the backend and execution mode a run resolves to, its precision.
Imports nothing above it (tests/test_layers.py): no pair, method, run or engine."""
