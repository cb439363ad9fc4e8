"""KV-cache-aware routing: which engine already holds a request's prefix.

Pure (no I/O, table-tested): ``prefix_hash`` (vLLM's block hashes of a token prefix), ``prefix_keys``
(a request's lazily computed prefix keys), ``prefix_scoring`` (the choice among endpoints),
``kv_events`` (decoding and bounding the engines' KV-event batches), ``chat_prompt`` (which chat
requests the router can render to the engine's exact prompt).
Edges: ``tokenizer`` and ``prompt_tokens`` (the served model's tokenizer and its bounded cache),
``kv_subscriber`` (ZMQ subscriptions to the engines' KV events, memory-bounded) over ``zmtp`` (a ZMTP
client that bounds whole messages, which libzmq does not), and
``prefix_routing`` (the router's state that glues them together).
"""
