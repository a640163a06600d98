"""Keras layers of the Transformer, one layer per module."""
