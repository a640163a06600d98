"""tf-transformer: the Transformer of "Attention Is All You Need" for machine translation."""
