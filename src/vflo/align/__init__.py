"""Sample alignment: which IDs the parties share."""
