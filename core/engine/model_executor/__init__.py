"""model_executor package."""
