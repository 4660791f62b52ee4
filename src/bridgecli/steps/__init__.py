"""One module per pipeline step: the work behind each subcommand, callable from Python."""
