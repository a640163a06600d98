"""The command-line tools: each a thin `main` over the library, run by `cli.run`."""
