"""One module per CLI subcommand, so each can grow without touching the others."""
