"""Kernel micro-benchmarks: one of our layers against Keras's, forward and backward."""
