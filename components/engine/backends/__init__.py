"""Engine backends, all serving ``components.engine.controller`` requests and returning the same ``Generation``:
``torch_backend`` (the torch decoder in this process: shared-KV or re-prefill merges), ``sglang_client`` (an
SGLang server's native ``/generate`` API over HTTP: re-prefill merges) and ``torch_tokens`` (an SGLang-shaped
token generator over a torch model, for the async driver and verl's agent loop on CPU, and the stand-in
server of the tests)."""
