"""What every package shares and nothing else: the user-error base class, writing a file
safely, the progress bar. It imports nothing of this project's."""
