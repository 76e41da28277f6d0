"""The jobs resource: submit, read (long-poll), cancel, predict."""
