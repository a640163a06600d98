"""Corpora, tokenization and tf.data input pipelines; imports nothing of tf_transformer's."""
