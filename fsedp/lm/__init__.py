"""A small MoE language model the project owns: configuration, tokenizer, a NumPy forward
pass with routing hooks (evaluation needs no torch), a torch training script, n-gram
baselines, and the committed weights (``fsedp/lm/assets``)."""
