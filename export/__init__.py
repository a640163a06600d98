"""Exports of a trained model: a SavedModel for TF Serving (string in, string out), and a
CTranslate2 model."""
