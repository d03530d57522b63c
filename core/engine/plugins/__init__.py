"""plugins package."""
