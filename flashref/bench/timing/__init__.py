"""How the harness times a call: ``call_time`` (host and kernel time of one call) and
``graph_time`` (calls captured in a CUDA graph and replayed)."""
