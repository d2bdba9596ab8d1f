"""Chapter 8's small character-level transformer: ``model`` (the model and its training),
``booktext`` (the book's own prose as its data) and ``generate`` (generation with the paged
cache on the GPU, one CUDA graph replay per token). torch is imported inside the functions.
"""
