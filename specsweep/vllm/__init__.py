"""vLLM: presets (``presets``) and tiny Hugging Face models for a real vLLM on CPU (``models``)."""
