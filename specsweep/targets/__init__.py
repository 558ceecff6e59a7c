"""Local targets: real servers and model files to measure on a machine without a GPU.

    sim/        an SGLang-compatible simulator (speculation, batching, faults), ``python -m specsweep.targets.sim``
    llamacpp/   tiny llama-architecture GGUF models and a launcher that serves llama-server's flags over xllamacpp
    vllm/       tiny Hugging Face models for vLLM's CPU backend

They know nothing of the engines' rules (``specsweep.engines``), which start them as any other server.
"""
