"""What is trained before a benchmark decodes with it: draft heads (heads/, ``python -m specbench.training.heads``)
and DISCO's classifier (disco/, ``python -m specbench.training.disco``). What decoding needs of their outputs (the
head's network and artifacts, the classifier's network) lives in models/ and methods/."""
