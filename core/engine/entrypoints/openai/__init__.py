"""entrypoints/openai package."""
