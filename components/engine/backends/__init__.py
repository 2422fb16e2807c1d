"""Engine backends: ``torch`` (this process, sequential and native parallel) and ``sglang`` (an HTTP client
of an SGLang server, sequential sampling on GPU)."""
