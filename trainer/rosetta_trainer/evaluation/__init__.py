"""A model scored and used: generation, metrics, loading a saved model for inference, CTranslate2 export."""
