"""One-off studies whose result is recorded in docs/notes.md."""
