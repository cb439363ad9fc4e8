"""One module per `pdfleet` subcommand that needs no cluster."""
