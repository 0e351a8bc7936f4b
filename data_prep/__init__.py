"""Data preparation: corpora, QA sets, indexes, the embedded knowledge base and model."""

from data_prep import lean_imports

lean_imports.install()  # before any process of ours loads transformers (data_prep/lean_imports.py)
