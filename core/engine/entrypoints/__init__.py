"""entrypoints package."""
