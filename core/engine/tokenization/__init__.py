"""tokenization package."""
